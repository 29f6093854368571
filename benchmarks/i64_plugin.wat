;; The peers' guest of bench_host_calls.py: an Extism plugin (also run on plain wasmtime) whose
;; `run` calls the host function `extism:host/user.hostfn` with one i64 argument N times
;; (N = 1000, the benchmark's HOST_CALLS) and whose `noop` calls nothing: the baseline.
;; Extism's PDK is not available offline, and a plugin needs none of it to call a host
;; function: Extism links its user functions under the `extism:host/user` module.
(module
  (import "extism:host/user" "hostfn" (func $hostfn (param i64)))
  (memory (export "memory") 1)
  (func (export "run") (result i32)
    (local $n i32)
    (local.set $n (i32.const 1000))
    (block $done
      (loop $again
        (br_if $done (i32.eqz (local.get $n)))
        (call $hostfn (i64.extend_i32_u (local.get $n)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $again)))
    (i32.const 0))
  (func (export "noop") (result i32) (i32.const 0)))
