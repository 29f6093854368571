"""The pure core: vocabulary, rules, codecs and the plug-in contract. No I/O."""
