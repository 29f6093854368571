"""What the tests share: helpers, guests, strategies and reference implementations."""
