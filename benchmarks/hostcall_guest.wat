;; The wasihost guest of bench_host_calls.py: each command makes N host calls with a fixed
;; 64-byte CBOR request, N being its input (a CBOR uint below 65,536), and answers the last
;; call's result (the response length, or a negated status) as a CBOR int, so that the
;; benchmark can check the calls did what it times.
;;
;;   log     wasihost_v1.log       [2, "x" * 60]    (a 64-byte info record)
;;   lookup  myapp_v1.lookup       {"key": "x" * 57}
;;   native_i64  myapp_v1.sink     one i64 (the loop counter), no result: the native
;;               convention, the same shape as Extism's host function in i64_plugin.wat
;;   any other command makes no call (its input is still read): the baseline.
;;
;; Hand-written rather than built on the guest SDK so that the loop around the host call is
;; a few instructions and the same for every case.
(module
  (@custom "wasihost_abi" "1.0")
  (@custom "wasihost_abi.myapp" "1.0")
  (import "wasihost_v1" "log" (func $log (param i32 i32 i32 i32) (result i32)))
  (import "myapp_v1" "lookup" (func $lookup (param i32 i32 i32 i32) (result i32)))
  (import "myapp_v1" "sink" (func $sink (param i64)))
  (memory (export "memory") 2)
  ;; hello's response: status 0, {"id": "bench.hostcalls", "version": "0.1.0", "abi": "1.0",
  ;; "features": []}
  (data (i32.const 1024) "\00\00\00\00\a4\62id\6fbench.hostcalls\67version\650.1.0\63abi\631.0\68features\80")
  ;; welcome's response: status 0, {"status": "ready"}
  (data (i32.const 2048) "\00\00\00\00\a1\66status\65ready")
  ;; a command's response: status 0, then one CBOR int written at 3076
  (data (i32.const 3072) "\00\00\00\00\00")
  ;; the log request: [2, text(60)]
  (data (i32.const 4096) "\82\02\78\3cxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
  ;; the lookup request: {"key": text(57)}
  (data (i32.const 4160) "\a1\63key\78\39xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")
  (func (export "wasihost_alloc") (param i32) (result i32) (i32.const 32768))

  ;; The CBOR uint at [$p, +$n): one, two or three bytes (below 65,536), else 0.
  (func $count (param $p i32) (param $n i32) (result i32)
    (local $b i32)
    (if (i32.eqz (local.get $n)) (then (return (i32.const 0))))
    (local.set $b (i32.load8_u (local.get $p)))
    (if (i32.lt_u (local.get $b) (i32.const 24)) (then (return (local.get $b))))
    (if (i32.eq (local.get $b) (i32.const 24))
      (then (return (i32.load8_u offset=1 (local.get $p)))))
    (if (i32.eq (local.get $b) (i32.const 25))
      (then (return (i32.or (i32.shl (i32.load8_u offset=1 (local.get $p)) (i32.const 8))
                            (i32.load8_u offset=2 (local.get $p))))))
    (i32.const 0))

  ;; A host call's result as a one-byte CBOR int: 0..23, or -1..-24.
  (func $cbor_small_int (param $r i32) (result i32)
    (if (i32.lt_s (local.get $r) (i32.const 0))
      (then (return (i32.or (i32.const 0x20)
                            (i32.and (i32.sub (i32.const -1) (local.get $r)) (i32.const 0x1f))))))
    (if (i32.gt_u (local.get $r) (i32.const 23)) (then (return (i32.const 23))))
    (local.get $r))

  (func (export "wasihost_call")
    (param $ptr i32) (param $cmd_len i32) (param $in_len i32) (result i64)
    (local $n i32) (local $r i32)
    (if (i32.eq (local.get $cmd_len) (i32.const 14))  ;; wasihost.hello
      (then (return (i64.const 0x0000040000000038))))  ;; 1024 << 32 | 56
    (if (i32.eq (local.get $cmd_len) (i32.const 16))  ;; wasihost.welcome
      (then (return (i64.const 0x0000080000000012))))  ;; 2048 << 32 | 18
    (local.set $n (call $count (i32.add (local.get $ptr) (local.get $cmd_len))
                               (local.get $in_len)))
    (if (i32.eq (local.get $cmd_len) (i32.const 3))  ;; log
      (then
        (block $done
          (loop $again
            (br_if $done (i32.eqz (local.get $n)))
            (local.set $r (call $log (i32.const 4096) (i32.const 64) (i32.const 8192) (i32.const 16)))
            (local.set $n (i32.sub (local.get $n) (i32.const 1)))
            (br $again)))))
    (if (i32.eq (local.get $cmd_len) (i32.const 6))  ;; lookup
      (then
        (block $done
          (loop $again
            (br_if $done (i32.eqz (local.get $n)))
            (local.set $r (call $lookup (i32.const 4160) (i32.const 64) (i32.const 8192) (i32.const 64)))
            (local.set $n (i32.sub (local.get $n) (i32.const 1)))
            (br $again)))))
    (if (i32.eq (local.get $cmd_len) (i32.const 10))  ;; native_i64
      (then
        (block $done
          (loop $again
            (br_if $done (i32.eqz (local.get $n)))
            (call $sink (i64.extend_i32_u (local.get $n)))
            (local.set $n (i32.sub (local.get $n) (i32.const 1)))
            (br $again)))))
    (i32.store8 (i32.const 3076) (call $cbor_small_int (local.get $r)))
    (i64.const 0x00000C0000000005)))  ;; 3072 << 32 | 5
