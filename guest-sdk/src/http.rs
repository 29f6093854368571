//! Capability `http` (ABI 1.1): one outbound HTTP request to an origin the manifest's
//! `[http] allowed_origins` lists (and the operator's grant allows).
//!
//! ```no_run
//! use wasihost_guest::http::Request;
//!
//! let response = Request::get("https://api.example.com/v1/items?page=2")
//!     .header("accept", "application/json")
//!     .send()?;
//! if response.status == 200 {
//!     let _json: &[u8] = &response.body;
//! }
//! let created = Request::post("https://api.example.com/v1/items", b"{\"name\":\"lamp\"}".to_vec())
//!     .header("content-type", "application/json")
//!     .secret_header("authorization", "api-token", "Bearer ") // the host attaches the secret
//!     .send()?;
//! # let _ = created;
//! # Ok::<(), wasihost_guest::Error>(())
//! ```
//!
//! The host resolves the name, refuses local addresses unless the operator allowed them, and
//! connects to the address it checked. It does not follow redirects: a `3xx` comes back with
//! its `location` header, and following it is a new request, checked like the first. Errors:
//! `DENIED` (origin or address not allowed), `UNAVAILABLE` (connection failed or timed out),
//! `INVALID_ARGUMENT` (malformed request, or a header the host owns such as `host` or
//! `content-length`), `PAYLOAD_TOO_LARGE` (response body over 49152 bytes),
//! `QUOTA_EXCEEDED` (the extension's bytes per hour are spent). A module built without
//! `abi: "1.1"` cannot import it.

use crate::abi::{Error, Result, HTTP_REQUEST};
use crate::cbor::{self, Value};
use crate::host;

#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wasihost_v1")]
extern "C" {
    /// Raw import `wasihost_v1.http_request`: request `{method, url, headers, body}`,
    /// response `{status, headers, body}` (CBOR, see the ABI registry).
    ///
    /// # Safety
    /// Both ranges must lie in linear memory and must not overlap, or the host traps the
    /// guest with class `protocol`.
    #[link_name = "http_request"]
    pub fn raw_http_request(req_ptr: i32, req_len: i32, resp_ptr: i32, resp_cap: i32) -> i32;
}

/// Stand-in for the raw import off wasm (native unit tests): always `-UNSUPPORTED`.
///
/// # Safety
/// Always safe; `unsafe` only to match the wasm declaration.
#[cfg(not(target_arch = "wasm32"))]
pub unsafe extern "C" fn raw_http_request(_req_ptr: i32, _req_len: i32, _resp_ptr: i32, _resp_cap: i32) -> i32 {
    -(crate::Status::UNSUPPORTED.code() as i32)
}

/// The largest request body the host sends.
pub const MAX_REQUEST_BODY_BYTES: usize = 32768;
/// The largest response body the host returns (`PAYLOAD_TOO_LARGE` beyond).
pub const MAX_RESPONSE_BODY_BYTES: usize = 49152;

/// A header's value: text, or a secret the host attaches without the guest seeing it.
#[derive(Clone, Debug, PartialEq)]
pub enum HeaderValue {
    /// Sent as is.
    Text(String),
    /// The host sends `prefix` followed by the secret `name` (needs capability `secrets`).
    Secret {
        /// The secret's name in the operator's store.
        name: String,
        /// Text sent before the secret, e.g. `"Bearer "`.
        prefix: String,
    },
}

/// A request, built up and then sent with [`Request::send`].
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// `GET`, `HEAD`, `POST`, `PUT`, `PATCH`, `DELETE` or `OPTIONS`.
    pub method: String,
    /// `http://` or `https://` URL of an allowed origin.
    pub url: String,
    /// Header names and values, in order.
    pub headers: Vec<(String, HeaderValue)>,
    /// The body, at most [`MAX_REQUEST_BODY_BYTES`].
    pub body: Option<Vec<u8>>,
}

/// What the server answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The HTTP status code (a `3xx` is returned, not followed).
    pub status: u16,
    /// Header names and values as the server sent them.
    pub headers: Vec<(String, String)>,
    /// The body, as sent (no content decoding).
    pub body: Vec<u8>,
}

impl Response {
    /// The first header called `name` (compared without case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Request {
    /// A request with `method` to `url`, no headers, no body.
    pub fn new(method: &str, url: &str) -> Request {
        Request {
            method: method.to_string(),
            url: url.to_string(),
            headers: Vec::new(),
            body: None,
        }
    }

    /// A `GET` of `url`.
    pub fn get(url: &str) -> Request {
        Request::new("GET", url)
    }

    /// A `POST` of `body` to `url`.
    pub fn post(url: &str, body: Vec<u8>) -> Request {
        Request::new("POST", url).body(body)
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_string(), HeaderValue::Text(value.to_string())));
        self
    }

    /// Adds a header whose value is `prefix` followed by the secret `secret`, attached by the
    /// host: the guest never holds the plaintext.
    pub fn secret_header(mut self, name: &str, secret: &str, prefix: &str) -> Request {
        self.headers.push((
            name.to_string(),
            HeaderValue::Secret {
                name: secret.to_string(),
                prefix: prefix.to_string(),
            },
        ));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: Vec<u8>) -> Request {
        self.body = Some(body);
        self
    }

    /// The request as the host reads it.
    pub fn to_value(&self) -> Value {
        let headers = self
            .headers
            .iter()
            .map(|(name, value)| {
                let value = match value {
                    HeaderValue::Text(text) => Value::from(text.as_str()),
                    HeaderValue::Secret { name, prefix } => Value::map([
                        ("secret", Value::from(name.as_str())),
                        ("prefix", Value::from(prefix.as_str())),
                    ]),
                };
                Value::Array(vec![Value::from(name.as_str()), value])
            })
            .collect::<Vec<Value>>();
        Value::map([
            ("method", Value::from(self.method.as_str())),
            ("url", Value::from(self.url.as_str())),
            ("headers", Value::Array(headers)),
            (
                "body",
                match &self.body {
                    Some(body) => Value::Bytes(body.clone()),
                    None => Value::Null,
                },
            ),
        ])
    }

    /// Sends the request and waits for the response (at most until the call's deadline).
    pub fn send(&self) -> Result<Response> {
        if self.body.as_ref().map_or(false, |b| b.len() > MAX_REQUEST_BODY_BYTES) {
            return Err(Error::invalid_input("http request body over 32768 bytes"));
        }
        let request = cbor::encode(&self.to_value()).map_err(|_| Error::invalid_input("http request is not encodable"))?;
        let response = host::call(&HTTP_REQUEST, &request, HTTP_REQUEST.max_response_bytes, |a, b, c, d| unsafe {
            raw_http_request(a, b, c, d)
        })?;
        parse_response(&host::decode(&HTTP_REQUEST, &response)?)
    }
}

/// One request: `method` to `url` with text `headers` and an optional `body`.
pub fn request(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Result<Response> {
    let mut built = Request::new(method, url);
    for (name, value) in headers {
        built = built.header(name, value);
    }
    if let Some(body) = body {
        built = built.body(body.to_vec());
    }
    built.send()
}

fn parse_response(value: &Value) -> Result<Response> {
    let bad = |what: &str| host::host_protocol(&HTTP_REQUEST, what);
    let status = value
        .get("status")
        .and_then(Value::as_u64)
        .filter(|s| *s <= u16::MAX as u64)
        .ok_or_else(|| bad("returned no status"))? as u16;
    let mut headers = Vec::new();
    for pair in value.get("headers").and_then(Value::as_array).ok_or_else(|| bad("returned no headers"))? {
        match pair.as_array() {
            Some([name, text]) => match (name.as_str(), text.as_str()) {
                (Some(name), Some(text)) => headers.push((name.to_string(), text.to_string())),
                _ => return Err(bad("returned a malformed header")),
            },
            _ => return Err(bad("returned a malformed header")),
        }
    }
    let body = value
        .get("body")
        .and_then(Value::as_bytes)
        .ok_or_else(|| bad("returned no body"))?
        .to_vec();
    Ok(Response { status, headers, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_encodes_as_the_registry_says() {
        let request = Request::post("http://a.test/x", b"hi".to_vec())
            .header("accept", "text/plain")
            .secret_header("authorization", "token", "Bearer ");
        let value = request.to_value();
        assert_eq!(value.get("method").and_then(Value::as_str), Some("POST"));
        assert_eq!(value.get("body").and_then(Value::as_bytes), Some(&b"hi"[..]));
        let headers = value.get("headers").and_then(Value::as_array).unwrap();
        assert_eq!(headers.len(), 2);
        assert_eq!(headers[1].as_array().unwrap()[1].get("secret").and_then(Value::as_str), Some("token"));
    }

    #[test]
    fn a_response_is_read_and_a_malformed_one_refused() {
        let value = Value::map([
            ("status", Value::from(302u64)),
            ("headers", Value::Array(vec![Value::Array(vec![Value::from("Location"), Value::from("/x")])])),
            ("body", Value::Bytes(vec![])),
        ]);
        let response = parse_response(&value).unwrap();
        assert_eq!(response.status, 302);
        assert_eq!(response.header("location"), Some("/x"));
        assert!(parse_response(&Value::map([("status", Value::from(200u64))])).is_err());
    }

    #[test]
    fn off_wasm_the_import_is_unsupported() {
        let err = Request::get("http://a.test/").send().unwrap_err();
        assert_eq!(err.status(), crate::Status::UNSUPPORTED);
    }
}
