//! The SDK's CBOR codec against the shared test vectors `abi/vectors/cbor.json`, which the
//! host's codec is checked against too. Skipped (with a note) while the file is absent.

mod common;

use common::{parse, repo_path, unhex, Json};
use wasihost_guest::cbor::{self, ErrorKind, Limits, Value};

fn to_value(j: &Json) -> Value {
    match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Int(i) => Value::Int(*i),
        Json::Float(f) => Value::Float(*f),
        Json::Str(s) => Value::Text(s.clone()),
        Json::Array(a) => Value::Array(a.iter().map(to_value).collect()),
        Json::Object(o) => {
            if o.len() == 1 && o[0].0 == "$bytes" {
                return Value::Bytes(unhex(o[0].1.as_str().expect("$bytes is hex")));
            }
            if o.len() == 1 && o[0].0 == "$float" {
                return Value::Float(match o[0].1.as_str() {
                    Some("NaN") => f64::NAN,
                    Some("Infinity") => f64::INFINITY,
                    Some("-Infinity") => f64::NEG_INFINITY,
                    other => panic!("$float {:?}", other),
                });
            }
            Value::Map(o.iter().map(|(k, v)| (Value::Text(k.clone()), to_value(v))).collect())
        }
    }
}

/// Exact equality, except that every NaN equals every NaN (JSON has one NaN); -0.0 and 0.0
/// differ.
fn same(decoded: &Value, expected: &Value) -> bool {
    match (decoded, expected) {
        (Value::Float(a), Value::Float(b)) => a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
        (Value::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y)),
        (Value::Map(a), Value::Map(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
        }
        _ => decoded == expected,
    }
}

/// The vectors' reason for each error kind.
fn reason(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Truncated => "truncated",
        ErrorKind::TrailingBytes => "trailing",
        ErrorKind::Malformed => "malformed",
        ErrorKind::TooLarge => "too_large",
        ErrorKind::TooDeep => "depth",
        ErrorKind::TooManyItems => "items",
        ErrorKind::StringTooLong => "string_length",
        ErrorKind::Indefinite => "indefinite",
        ErrorKind::Tag => "tag",
        ErrorKind::Undefined => "undefined",
        ErrorKind::Simple => "simple",
        ErrorKind::IntegerRange => "int_range",
        ErrorKind::Utf8 => "utf8",
        ErrorKind::KeyType => "key_type",
        ErrorKind::DuplicateKey => "duplicate_key",
        _ => "?",
    }
}

fn limits_from(file: &Json) -> Limits {
    let mut limits = Limits::DEFAULT;
    if let Some(l) = file.get("limits") {
        let get = |k: &str| l.get(k).and_then(Json::as_i128).map(|v| v as usize);
        if let Some(v) = get("max_depth") {
            limits.max_depth = v;
        }
        if let Some(v) = get("max_items") {
            limits.max_items = v;
        }
        if let Some(v) = get("max_string_bytes") {
            limits.max_string_bytes = v;
        }
        if let Some(v) = get("max_bytes") {
            limits.max_bytes = v;
        }
    }
    limits
}

#[test]
fn shared_cbor_vectors() {
    let path = repo_path("abi/vectors/cbor.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(_) => {
            eprintln!("note: {} not present; shared CBOR vectors skipped", path.display());
            return;
        }
    };
    let file = parse(&text);
    let limits = limits_from(&file);
    let vectors = file.get("vectors").and_then(Json::as_array).expect("vectors array");
    assert!(!vectors.is_empty());
    let mut failures = Vec::new();
    for v in vectors {
        let name = v.get("name").and_then(Json::as_str).unwrap_or("?");
        let bytes = unhex(v.get("hex").and_then(Json::as_str).expect("hex"));
        let valid = matches!(v.get("valid"), Some(Json::Bool(true)));
        let got = cbor::decode_with(&bytes, &limits);
        match (valid, &got) {
            (true, Ok(decoded)) => {
                if let Some(expected) = v.get("value") {
                    let expected = to_value(expected);
                    if !same(decoded, &expected) {
                        failures.push(format!("{}: decoded {:?}, expected {:?}", name, decoded, expected));
                    }
                }
                // A valid item re-encodes to something that decodes to the same value.
                let again = cbor::encode(decoded).map_err(|e| e.to_string()).and_then(|b| cbor::decode(&b).map_err(|e| e.to_string()));
                match again {
                    Ok(back) if same(&back, decoded) => {}
                    other => failures.push(format!("{}: round trip gave {:?}", name, other)),
                }
            }
            (true, Err(e)) => failures.push(format!("{}: valid, but refused: {}", name, e)),
            (false, Ok(decoded)) => failures.push(format!(
                "{}: invalid ({}), but decoded to {:?}",
                name,
                v.get("reason").and_then(Json::as_str).unwrap_or("?"),
                decoded
            )),
            (false, Err(e)) => {
                // The reason names the first violation met reading front to back; "empty" is
                // our Truncated at offset 0.
                let want = v.get("reason").and_then(Json::as_str).unwrap_or("?");
                let got = if bytes.is_empty() { "empty" } else { reason(e.kind) };
                if want != got {
                    failures.push(format!("{}: refused as {} ({}), the vector says {}", name, got, e, want));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} vectors failed:\n{}", failures.len(), vectors.len(), failures.join("\n"));
    eprintln!("{} shared CBOR vectors passed", vectors.len());
}
