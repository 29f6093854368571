//! Capability `jobs` (ABI 1.1): background jobs, run by the host as one of your commands.
//!
//! ```no_run
//! use wasihost_guest::{jobs, Error, Value};
//!
//! // Run "refresh" once, 5 s from now; "sync" every minute; "reindex" on each
//! // "orders.created" event the application publishes.
//! let once = jobs::schedule(&jobs::Job::once("refresh", 5_000))?;
//! let every = jobs::schedule(&jobs::Job::every("sync", 60_000).input(Value::from("all")))?;
//! let on = jobs::schedule(&jobs::Job::on_event("reindex", "orders.created"))?;
//! assert!(jobs::cancel(every)?);
//! # let _ = (once, on);
//!
//! // A job command receives {"job": id, "run": n, "input": ..., "skipped": n,
//! // "event": null | {"class": text, "payload": any}}.
//! fn sync(input: Value) -> Result<Value, Error> {
//!     let _run = input.get("run").and_then(Value::as_u64);
//!     Ok(Value::Null)
//! }
//! # Ok::<(), Error>(())
//! ```
//!
//! A job's command must be listed in the manifest's `[jobs] commands`; anything else is
//! `DENIED`. A period under [`MIN_PERIOD_MS`], a malformed request or an input over
//! [`MAX_INPUT_BYTES`] is `INVALID_ARGUMENT`; more jobs than the manifest's `max_jobs` is
//! `QUOTA_EXCEEDED`. Each run has the `[jobs]` budget (`max_runtime_ms`, `fuel`): a run that
//! overruns it is ended and counted as failed, and a periodic job whose previous run is still
//! going skips that tick. Jobs last as long as the extension (across instance restarts) and
//! do not run while it is paused, quarantined or revoked. An event-driven job also needs the
//! `events` capability, and its class within the manifest's `[events] classes`. The guest
//! declares `abi: "1.1"` in [`guest!`](crate::guest!) and `abi = "1.1"` in its manifest.

use crate::abi::{Result, JOBS_CANCEL, JOBS_SCHEDULE};
use crate::cbor::{self, Value};
use crate::host;

/// The shortest period of a periodic job, in milliseconds (the host's policy minimum).
pub const MIN_PERIOD_MS: u64 = 1_000;
/// Largest encoded job input, in bytes.
pub const MAX_INPUT_BYTES: usize = 4096;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.jobs_schedule`: request map `{command, input, every_ms,
    /// delay_ms, on_event}`, response uint (the job id).
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "jobs_schedule"]
    pub fn raw_jobs_schedule(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;

    /// Raw import `wasihost_v1.jobs_cancel`: request uint, response bool.
    ///
    /// # Safety
    /// As for [`raw_jobs_schedule`].
    #[link_name = "jobs_cancel"]
    pub fn raw_jobs_cancel(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_jobs_schedule(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_jobs_cancel(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// A job to schedule: build it with [`Job::once`], [`Job::every`] or [`Job::on_event`].
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    /// The command the host runs (one of the manifest's `[jobs] commands`).
    pub command: String,
    /// What the command receives as `input` on every run.
    pub input: Value,
    /// Run every this many milliseconds (periodic).
    pub every_ms: Option<u64>,
    /// Run once after this many milliseconds (or, with `every_ms`, first run after it).
    pub delay_ms: Option<u64>,
    /// Run on each event of this class the application publishes.
    pub on_event: Option<String>,
}

impl Job {
    fn new(command: &str) -> Job {
        Job { command: command.into(), input: Value::Null, every_ms: None, delay_ms: None, on_event: None }
    }

    /// Run `command` once, `delay_ms` milliseconds from now.
    pub fn once(command: &str, delay_ms: u64) -> Job {
        Job { delay_ms: Some(delay_ms), ..Job::new(command) }
    }

    /// Run `command` every `every_ms` milliseconds (at least [`MIN_PERIOD_MS`]).
    pub fn every(command: &str, every_ms: u64) -> Job {
        Job { every_ms: Some(every_ms), ..Job::new(command) }
    }

    /// Run `command` on each event of class `class`.
    pub fn on_event(command: &str, class: &str) -> Job {
        Job { on_event: Some(class.into()), ..Job::new(command) }
    }

    /// The same job, whose runs receive `input`.
    pub fn input(mut self, input: Value) -> Job {
        self.input = input;
        self
    }

    fn to_value(&self) -> Value {
        let opt = |v: Option<u64>| v.map(Value::from).unwrap_or(Value::Null);
        Value::map([
            ("command", Value::from(self.command.as_str())),
            ("input", self.input.clone()),
            ("every_ms", opt(self.every_ms)),
            ("delay_ms", opt(self.delay_ms)),
            ("on_event", self.on_event.as_deref().map(Value::from).unwrap_or(Value::Null)),
        ])
    }
}

/// Sends `request` (any value, for tests of the host's checks) as a `jobs_schedule` request;
/// returns the job id.
pub fn schedule_value(request: &Value) -> Result<u64> {
    let bytes = cbor::encode(request)?;
    let response = host::call(&JOBS_SCHEDULE, &bytes, JOBS_SCHEDULE.max_response_bytes, |a, b, c, d| unsafe {
        raw_jobs_schedule(a, b, c, d)
    })?;
    let value = host::decode(&JOBS_SCHEDULE, &response)?;
    value.as_u64().ok_or_else(|| host::host_protocol(&JOBS_SCHEDULE, "did not return a job id"))
}

/// Schedules `job`; returns its id (unique within the extension).
pub fn schedule(job: &Job) -> Result<u64> {
    schedule_value(&job.to_value())
}

/// Cancels the job `id`; returns whether one of this extension's jobs was cancelled. A run in
/// progress finishes.
pub fn cancel(id: u64) -> Result<bool> {
    let request = cbor::encode(&Value::from(id))?;
    let response = host::call(&JOBS_CANCEL, &request, JOBS_CANCEL.max_response_bytes, |a, b, c, d| unsafe {
        raw_jobs_cancel(a, b, c, d)
    })?;
    match host::decode(&JOBS_CANCEL, &response)? {
        Value::Bool(cancelled) => Ok(cancelled),
        _ => Err(host::host_protocol(&JOBS_CANCEL, "did not return a bool")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_have_every_key() {
        let v = Job::every("sync", 60_000).input(Value::from(1u64)).to_value();
        assert_eq!(v.get("command").and_then(Value::as_str), Some("sync"));
        assert_eq!(v.get("every_ms").and_then(Value::as_u64), Some(60_000));
        assert!(v.get("delay_ms").map_or(false, Value::is_null));
        assert!(v.get("on_event").map_or(false, Value::is_null));
    }

    #[test]
    fn off_wasm_the_import_is_unsupported() {
        assert_eq!(schedule(&Job::once("x", 0)).unwrap_err().status(), crate::Status::UNSUPPORTED);
        assert_eq!(cancel(1).unwrap_err().status(), crate::Status::UNSUPPORTED);
    }
}
