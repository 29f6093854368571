//! CBOR values of the ABI's profile (`abi/README.md` section 9), encoded and decoded with
//! `ciborium-ll`.
//!
//! The profile: one definite-length item filling the buffer exactly; nesting depth at most
//! 32; at most 4096 data items; strings at most 65,536 bytes; integers from `-2^64` to
//! `2^64 - 1` (major types 0 and 1); floats of 16, 32 or 64 bits; simple values only
//! `false`, `true`, `null`; no tags; text is UTF-8; map keys are text or integers and never
//! repeated. [`decode`] refuses anything else and [`encode`] refuses to produce it, both with
//! the one [`Error`] type of this module.
//!
//! Counting rules (the host's, pinned by `abi/vectors/cbor.json`): *depth* counts nested arrays
//! and maps (`[0]` has depth 1, a bare `0` depth 0); *items* counts every data item, each
//! container, element, key and value (`[0, 0]` is three items, `{"a": 0}` three as well).
//!
//! ```
//! use wasihost_guest::cbor::{self, Value};
//!
//! let v = Value::map([("name", Value::from("ada")), ("n", Value::from(3u32))]);
//! let bytes = cbor::encode(&v).unwrap();
//! let back = cbor::decode(&bytes).unwrap();
//! assert_eq!(back.get("name").and_then(Value::as_str), Some("ada"));
//! assert_eq!(back.get("n").and_then(Value::as_u64), Some(3));
//! ```

use std::fmt;

use ciborium_io::{Read, Write};
use ciborium_ll::{simple, Decoder, Encoder, Header};

/// Nesting limit of the profile.
pub const MAX_DEPTH: usize = 32;
/// Data item limit of the profile.
pub const MAX_ITEMS: usize = 4096;
/// Text and byte string limit of the profile.
pub const MAX_STRING_BYTES: usize = 65536;
/// Smallest integer of the profile (`-2^64`, major type 1's range).
pub const INT_MIN: i128 = -(1i128 << 64);
/// Largest integer of the profile (`2^64 - 1`).
pub const INT_MAX: i128 = (1i128 << 64) - 1;

/// A CBOR value of the profile.
///
/// Maps keep their entries in order as a list of pairs; [`Value::get`] looks a text key up.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null`
    Null,
    /// `false` / `true`
    Bool(bool),
    /// An integer, `-2^64 ..= 2^64 - 1`.
    Int(i128),
    /// A float (decoded from half, single or double precision; encoded in the shortest
    /// of the three that keeps the value exactly).
    Float(f64),
    /// A UTF-8 text string.
    Text(String),
    /// A byte string.
    Bytes(Vec<u8>),
    /// An array.
    Array(Vec<Value>),
    /// A map; keys must be `Int` or `Text` and distinct.
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// A map with text keys, from `(key, value)` pairs.
    pub fn map<K, I>(entries: I) -> Value
    where
        K: Into<String>,
        I: IntoIterator<Item = (K, Value)>,
    {
        Value::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Value::Text(k.into()), v))
                .collect(),
        )
    }

    /// An array from anything that converts into values.
    pub fn array<T: Into<Value>, I: IntoIterator<Item = T>>(items: I) -> Value {
        Value::Array(items.into_iter().map(Into::into).collect())
    }

    /// The value under text key `key` of a map; `None` for a missing key or a non-map.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => entries.iter().find_map(|(k, v)| match k {
                Value::Text(t) if t == key => Some(v),
                _ => None,
            }),
            _ => None,
        }
    }

    /// Sets text key `key` of a map (replacing an existing entry); does nothing to a non-map.
    pub fn insert(&mut self, key: &str, value: Value) {
        if let Value::Map(entries) = self {
            for (k, v) in entries.iter_mut() {
                if matches!(k, Value::Text(t) if t == key) {
                    *v = value;
                    return;
                }
            }
            entries.push((Value::Text(key.to_owned()), value));
        }
    }

    /// `true` for `Null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The boolean of a `Bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The integer of an `Int`, if it fits a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// The integer of an `Int`, if it fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => i64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// The number of a `Float`, or of an `Int` (rounded to the nearest `f64`).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The string of a `Text`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes of a `Bytes`.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The elements of an `Array`.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The entries of a `Map`.
    pub fn as_map(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(i: $t) -> Value {
                Value::Int(i as i128)
            }
        }
    )*};
}
from_int!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize);

impl From<f64> for Value {
    fn from(f: f64) -> Value {
        Value::Float(f)
    }
}

impl From<f32> for Value {
    fn from(f: f32) -> Value {
        Value::Float(f as f64)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Text(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Text(s)
    }
}

impl From<&[u8]> for Value {
    fn from(b: &[u8]) -> Value {
        Value::Bytes(b.to_vec())
    }
}

impl From<Vec<Value>> for Value {
    fn from(a: Vec<Value>) -> Value {
        Value::Array(a)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(o: Option<T>) -> Value {
        o.map_or(Value::Null, Into::into)
    }
}

/// Bounds applied while encoding and decoding. [`Limits::DEFAULT`] is the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest encoded size in bytes (the entry's or command's own limit).
    pub max_bytes: usize,
    /// Deepest nesting of arrays and maps.
    pub max_depth: usize,
    /// Most data items.
    pub max_items: usize,
    /// Longest text or byte string, in bytes.
    pub max_string_bytes: usize,
}

impl Limits {
    /// The profile's limits, with no size limit of its own (callers supply the entry's).
    pub const DEFAULT: Limits = Limits {
        max_bytes: usize::MAX,
        max_depth: MAX_DEPTH,
        max_items: MAX_ITEMS,
        max_string_bytes: MAX_STRING_BYTES,
    };

    /// A command's input and output: the profile's depth and item bounds, but a string may
    /// be as long as the whole payload. The host bounds a command's payload by the extension's
    /// `max_input_bytes` / `max_output_bytes` (up to 16 MiB), not by the 64 KiB string cap of
    /// host-call requests, so that one value can carry what those limits allow.
    pub const COMMAND: Limits = Limits {
        max_bytes: usize::MAX,
        max_depth: MAX_DEPTH,
        max_items: MAX_ITEMS,
        max_string_bytes: usize::MAX,
    };
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}

/// What went wrong while encoding or decoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The input ended inside an item, or a length claims more bytes than are left.
    Truncated,
    /// Bytes after the one item.
    TrailingBytes,
    /// Not well-formed CBOR: reserved additional information (28..30, or 31 on majors 0, 1
    /// and 6), or a stray "break".
    Malformed,
    /// Encoded size over [`Limits::max_bytes`].
    TooLarge,
    /// Nesting over [`Limits::max_depth`].
    TooDeep,
    /// More than [`Limits::max_items`] data items.
    TooManyItems,
    /// A string over [`Limits::max_string_bytes`].
    StringTooLong,
    /// Indefinite-length string, array or map.
    Indefinite,
    /// A tag.
    Tag,
    /// The simple value `undefined`.
    Undefined,
    /// A simple value other than `false`, `true`, `null`, `undefined`, or any two-byte
    /// simple value (`f8 xx`).
    Simple,
    /// An integer outside `-2^64 ..= 2^64 - 1`.
    IntegerRange,
    /// Text that is not UTF-8.
    Utf8,
    /// A map key that is neither text nor an integer.
    KeyType,
    /// A map key that appears twice.
    DuplicateKey,
}

impl ErrorKind {
    fn describe(self) -> &'static str {
        match self {
            ErrorKind::Truncated => "truncated",
            ErrorKind::TrailingBytes => "trailing bytes after the item",
            ErrorKind::Malformed => "malformed item",
            ErrorKind::TooLarge => "encoded size over the limit",
            ErrorKind::TooDeep => "nesting too deep",
            ErrorKind::TooManyItems => "too many data items",
            ErrorKind::StringTooLong => "string too long",
            ErrorKind::Indefinite => "indefinite length not allowed",
            ErrorKind::Tag => "tags not allowed",
            ErrorKind::Undefined => "undefined not allowed",
            ErrorKind::Simple => "simple value not allowed",
            ErrorKind::IntegerRange => "integer out of range",
            ErrorKind::Utf8 => "text is not UTF-8",
            ErrorKind::KeyType => "map key is not text or an integer",
            ErrorKind::DuplicateKey => "duplicate map key",
        }
    }
}

/// An encoding or decoding failure: what, and at which byte offset (of the input when
/// decoding, of the output so far when encoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Byte offset where it was noticed.
    pub offset: usize,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CBOR: {} at offset {}", self.kind.describe(), self.offset)
    }
}

impl std::error::Error for Error {}

impl From<Error> for crate::Error {
    /// Class `invalid_input`: a CBOR error is nearly always bad input.
    fn from(e: Error) -> crate::Error {
        crate::Error::invalid_input(e.to_string())
    }
}

// -- decoding --------------------------------------------------------------------------------

/// Reads from a slice; `ciborium-io` only provides this for `&[u8]` without its `std`
/// feature, so a local reader keeps the build independent of feature unification.
struct Src<'a>(&'a [u8]);

impl Read for Src<'_> {
    type Error = ();

    fn read_exact(&mut self, data: &mut [u8]) -> Result<(), ()> {
        if data.len() > self.0.len() {
            return Err(());
        }
        let (head, tail) = self.0.split_at(data.len());
        data.copy_from_slice(head);
        self.0 = tail;
        Ok(())
    }
}

struct Dec<'a> {
    buf: &'a [u8],
    dec: Decoder<Src<'a>>,
    items_left: usize,
    limits: Limits,
}

impl<'a> Dec<'a> {
    fn fail<T>(&mut self, kind: ErrorKind, offset: usize) -> Result<T, Error> {
        Err(Error { kind, offset })
    }

    fn left(&mut self) -> usize {
        self.buf.len() - self.dec.offset()
    }

    fn item(&mut self, depth: usize) -> Result<Value, Error> {
        let at = self.dec.offset();
        if at >= self.buf.len() {
            return self.fail(ErrorKind::Truncated, at);
        }
        if self.items_left == 0 {
            return self.fail(ErrorKind::TooManyItems, at);
        }
        self.items_left -= 1;
        let initial = self.buf[at];
        let header = match self.dec.pull() {
            Ok(h) => h,
            Err(ciborium_ll::Error::Io(())) => return self.fail(ErrorKind::Truncated, at),
            // Reserved additional information 28..30, or 31 on a major type without an
            // indefinite form (0, 1, 6).
            Err(ciborium_ll::Error::Syntax(_)) => return self.fail(ErrorKind::Malformed, at),
        };
        match header {
            Header::Positive(n) => Ok(Value::Int(n as i128)),
            Header::Negative(n) => Ok(Value::Int(-1 - n as i128)),
            Header::Float(f) => Ok(Value::Float(f)),
            // 0xf8 with a value: values below 32 are not well-formed in that form, and the
            // rest are not in the profile either.
            Header::Simple(_) if initial == 0xf8 => self.fail(ErrorKind::Simple, at),
            Header::Simple(simple::FALSE) => Ok(Value::Bool(false)),
            Header::Simple(simple::TRUE) => Ok(Value::Bool(true)),
            Header::Simple(simple::NULL) => Ok(Value::Null),
            Header::Simple(simple::UNDEFINED) => self.fail(ErrorKind::Undefined, at),
            Header::Simple(_) => self.fail(ErrorKind::Simple, at),
            Header::Tag(_) => self.fail(ErrorKind::Tag, at),
            // A "break" outside an indefinite-length item.
            Header::Break => self.fail(ErrorKind::Malformed, at),
            Header::Bytes(None)
            | Header::Text(None)
            | Header::Array(None)
            | Header::Map(None) => self.fail(ErrorKind::Indefinite, at),
            Header::Bytes(Some(len)) => self.string(len, at).map(Value::Bytes),
            Header::Text(Some(len)) => {
                let raw = self.string(len, at)?;
                match String::from_utf8(raw) {
                    Ok(s) => Ok(Value::Text(s)),
                    Err(_) => self.fail(ErrorKind::Utf8, at),
                }
            }
            Header::Array(Some(len)) => {
                let depth = self.enter(depth, len, at)?;
                let mut out = Vec::with_capacity(len);
                for _ in 0..len {
                    out.push(self.item(depth)?);
                }
                Ok(Value::Array(out))
            }
            Header::Map(Some(len)) => {
                let children = len.saturating_mul(2);
                let depth = self.enter(depth, children, at)?;
                let mut out: Vec<(Value, Value)> = Vec::with_capacity(len);
                for _ in 0..len {
                    let key_at = self.dec.offset();
                    // Checked on the head, so a container key is refused before it is built.
                    if key_at < self.buf.len() && !matches!(self.buf[key_at] >> 5, 0 | 1 | 3) {
                        return self.fail(ErrorKind::KeyType, key_at);
                    }
                    let key = self.item(depth)?;
                    if out.iter().any(|(k, _)| *k == key) {
                        return self.fail(ErrorKind::DuplicateKey, key_at);
                    }
                    let value = self.item(depth)?;
                    out.push((key, value));
                }
                Ok(Value::Map(out))
            }
        }
    }

    fn string(&mut self, len: usize, at: usize) -> Result<Vec<u8>, Error> {
        if len > self.limits.max_string_bytes {
            return self.fail(ErrorKind::StringTooLong, at);
        }
        if len > self.left() {
            return self.fail(ErrorKind::Truncated, at);
        }
        let mut out = vec![0u8; len];
        if self.dec.read_exact(&mut out).is_err() {
            return self.fail(ErrorKind::Truncated, at);
        }
        Ok(out)
    }

    fn enter(&mut self, depth: usize, children: usize, at: usize) -> Result<usize, Error> {
        let depth = depth + 1;
        if depth > self.limits.max_depth {
            return self.fail(ErrorKind::TooDeep, at);
        }
        if children > self.items_left {
            return self.fail(ErrorKind::TooManyItems, at);
        }
        // Every child is at least one byte: a longer count is a lie, and nothing is
        // allocated for it.
        if children > self.left() {
            return self.fail(ErrorKind::Truncated, at);
        }
        Ok(depth)
    }
}

/// Decodes one item of the profile that fills `bytes` exactly.
pub fn decode(bytes: &[u8]) -> Result<Value, Error> {
    decode_with(bytes, &Limits::DEFAULT)
}

/// [`decode`] with explicit limits.
pub fn decode_with(bytes: &[u8], limits: &Limits) -> Result<Value, Error> {
    if bytes.len() > limits.max_bytes {
        return Err(Error {
            kind: ErrorKind::TooLarge,
            offset: limits.max_bytes,
        });
    }
    let mut d = Dec {
        buf: bytes,
        dec: Decoder::from(Src(bytes)),
        items_left: limits.max_items,
        limits: *limits,
    };
    let value = d.item(0)?;
    let end = d.dec.offset();
    if end != bytes.len() {
        return Err(Error {
            kind: ErrorKind::TrailingBytes,
            offset: end,
        });
    }
    Ok(value)
}

// -- encoding --------------------------------------------------------------------------------

struct Sink<'a>(&'a mut Vec<u8>);

impl Write for Sink<'_> {
    type Error = core::convert::Infallible;

    fn write_all(&mut self, data: &[u8]) -> Result<(), Self::Error> {
        self.0.extend_from_slice(data);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

struct Enc<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
    items_left: usize,
    limits: Limits,
}

impl Enc<'_> {
    fn fail<T>(&mut self, kind: ErrorKind) -> Result<T, Error> {
        let offset = self.out.len() - self.start;
        Err(Error { kind, offset })
    }

    fn push(&mut self, h: Header) {
        // Encoder is a zero-cost wrapper around the writer; one per header keeps `out`
        // readable between writes.
        match Encoder::from(Sink(self.out)).push(h) {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    fn item(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        if self.items_left == 0 {
            return self.fail(ErrorKind::TooManyItems);
        }
        self.items_left -= 1;
        match v {
            Value::Null => self.push(Header::Simple(simple::NULL)),
            Value::Bool(b) => self.push(Header::Simple(if *b { simple::TRUE } else { simple::FALSE })),
            Value::Int(i) => {
                if *i < INT_MIN || *i > INT_MAX {
                    return self.fail(ErrorKind::IntegerRange);
                }
                if *i >= 0 {
                    self.push(Header::Positive(*i as u64));
                } else {
                    self.push(Header::Negative((-1 - *i) as u64));
                }
            }
            Value::Float(f) => self.push(Header::Float(*f)),
            Value::Text(s) => {
                if s.len() > self.limits.max_string_bytes {
                    return self.fail(ErrorKind::StringTooLong);
                }
                self.push(Header::Text(Some(s.len())));
                self.out.extend_from_slice(s.as_bytes());
            }
            Value::Bytes(b) => {
                if b.len() > self.limits.max_string_bytes {
                    return self.fail(ErrorKind::StringTooLong);
                }
                self.push(Header::Bytes(Some(b.len())));
                self.out.extend_from_slice(b);
            }
            Value::Array(a) => {
                self.enter(depth, a.len())?;
                self.push(Header::Array(Some(a.len())));
                for x in a {
                    self.item(x, depth + 1)?;
                }
            }
            Value::Map(m) => {
                self.enter(depth, m.len().saturating_mul(2))?;
                self.push(Header::Map(Some(m.len())));
                for (i, (k, x)) in m.iter().enumerate() {
                    if !matches!(k, Value::Int(_) | Value::Text(_)) {
                        return self.fail(ErrorKind::KeyType);
                    }
                    if m[..i].iter().any(|(other, _)| other == k) {
                        return self.fail(ErrorKind::DuplicateKey);
                    }
                    self.item(k, depth + 1)?;
                    self.item(x, depth + 1)?;
                }
            }
        }
        if self.out.len() - self.start > self.limits.max_bytes {
            return self.fail(ErrorKind::TooLarge);
        }
        Ok(())
    }

    fn enter(&mut self, depth: usize, children: usize) -> Result<(), Error> {
        if depth + 1 > self.limits.max_depth {
            return self.fail(ErrorKind::TooDeep);
        }
        if children > self.items_left {
            return self.fail(ErrorKind::TooManyItems);
        }
        Ok(())
    }
}

/// Encodes `value` (which must be within the profile) into a new vector.
pub fn encode(value: &Value) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    encode_into(value, &mut out, &Limits::DEFAULT)?;
    Ok(out)
}

/// Appends the encoding of `value` to `out`, checking `limits` (`max_bytes` counts only the
/// bytes appended). On error `out` is left as it was.
pub fn encode_into(value: &Value, out: &mut Vec<u8>, limits: &Limits) -> Result<(), Error> {
    let start = out.len();
    let mut e = Enc {
        out,
        start,
        items_left: limits.max_items,
        limits: *limits,
    };
    let result = e.item(value, 0);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(bytes: &[u8]) -> ErrorKind {
        decode(bytes).unwrap_err().kind
    }

    fn nested(depth: usize) -> Vec<u8> {
        let mut b = vec![0x81; depth];
        b.push(0x00);
        b
    }

    #[test]
    fn scalars() {
        assert_eq!(decode(&[0x00]).unwrap(), Value::Int(0));
        assert_eq!(decode(&[0x20]).unwrap(), Value::Int(-1));
        assert_eq!(decode(&[0x1b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).unwrap(), Value::Int(INT_MAX));
        assert_eq!(decode(&[0x3b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).unwrap(), Value::Int(INT_MIN));
        assert_eq!(decode(&[0xf4]).unwrap(), Value::Bool(false));
        assert_eq!(decode(&[0xf5]).unwrap(), Value::Bool(true));
        assert_eq!(decode(&[0xf6]).unwrap(), Value::Null);
        assert_eq!(decode(&[0xf9, 0x3c, 0x00]).unwrap(), Value::Float(1.0));
        assert_eq!(decode(&[0xfa, 0x3f, 0xc0, 0x00, 0x00]).unwrap(), Value::Float(1.5));
        assert_eq!(decode(&[0x18, 0x05]).unwrap(), Value::Int(5)); // not preferred, still well-formed
        assert_eq!(decode(&[0x63, b'a', b'b', b'c']).unwrap(), Value::Text("abc".into()));
        assert_eq!(decode(&[0x42, 1, 2]).unwrap(), Value::Bytes(vec![1, 2]));
    }

    #[test]
    fn refusals() {
        assert_eq!(kind(&[]), ErrorKind::Truncated);
        assert_eq!(kind(&[0x18]), ErrorKind::Truncated);
        assert_eq!(kind(&[0x00, 0x00]), ErrorKind::TrailingBytes);
        assert_eq!(kind(&[0x1c]), ErrorKind::Malformed);
        assert_eq!(kind(&[0xf7]), ErrorKind::Undefined);
        assert_eq!(kind(&[0xf0]), ErrorKind::Simple);
        assert_eq!(kind(&[0xf8, 0x14]), ErrorKind::Simple); // two-byte false: not well-formed
        assert_eq!(kind(&[0xf8, 0xff]), ErrorKind::Simple);
        assert_eq!(kind(&[0xc0, 0x00]), ErrorKind::Tag);
        assert_eq!(kind(&[0x5f, 0xff]), ErrorKind::Indefinite);
        assert_eq!(kind(&[0x9f, 0xff]), ErrorKind::Indefinite);
        assert_eq!(kind(&[0xbf, 0xff]), ErrorKind::Indefinite);
        assert_eq!(kind(&[0xff]), ErrorKind::Malformed);
        assert_eq!(kind(&[0x1f]), ErrorKind::Malformed);
        assert_eq!(kind(&[0x62, 0xc3, 0x28]), ErrorKind::Utf8);
        assert_eq!(kind(&[0xa1, 0x80, 0x00]), ErrorKind::KeyType);
        assert_eq!(kind(&[0xa1, 0xf6, 0x00]), ErrorKind::KeyType);
        assert_eq!(kind(&[0xa2, 0x01, 0x00, 0x01, 0x00]), ErrorKind::DuplicateKey);
        assert_eq!(kind(&[0xa2, 0x61, b'a', 0x00, 0x61, b'a', 0x00]), ErrorKind::DuplicateKey);
        // A huge claimed length is refused before anything is allocated.
        assert_eq!(kind(&[0x9b, 0, 0, 0, 0, 0, 0, 0x10, 0x00]), ErrorKind::TooManyItems);
        assert_eq!(kind(&[0x83, 0x00]), ErrorKind::Truncated);
        assert_eq!(kind(&[0xa2, 0x00, 0x00]), ErrorKind::Truncated);
        assert_eq!(kind(&[0x5a, 0, 1, 0, 1]), ErrorKind::StringTooLong);
        assert_eq!(kind(&[0x5a, 0, 1, 0, 0]), ErrorKind::Truncated);
    }

    #[test]
    fn depth_and_items() {
        assert!(decode(&nested(32)).is_ok());
        assert_eq!(kind(&nested(33)), ErrorKind::TooDeep);
        // [0 x 4095] is 4096 items; one more is too many.
        let mut ok = vec![0x99, 0x0f, 0xff];
        ok.extend(std::iter::repeat(0).take(4095));
        assert!(decode(&ok).is_ok());
        let mut over = vec![0x99, 0x10, 0x00];
        over.extend(std::iter::repeat(0).take(4096));
        assert_eq!(kind(&over), ErrorKind::TooManyItems);
        // Strings: 65536 bytes allowed.
        let mut s = vec![0x5a, 0, 1, 0, 0];
        s.extend(std::iter::repeat(7).take(65536));
        assert!(decode(&s).is_ok());
    }

    #[test]
    fn round_trip_and_encode_checks() {
        let v = Value::map([
            ("a", Value::array([1i64, -2, 300])),
            ("b", Value::Bytes(vec![0; 3])),
            ("f", Value::Float(0.1)),
            ("h", Value::Float(-2.0)),
            ("n", Value::Null),
            ("t", Value::Bool(true)),
        ]);
        let bytes = encode(&v).unwrap();
        assert_eq!(decode(&bytes).unwrap(), v);
        assert_eq!(encode(&Value::Int(INT_MAX + 1)).unwrap_err().kind, ErrorKind::IntegerRange);
        assert_eq!(encode(&Value::Int(INT_MIN - 1)).unwrap_err().kind, ErrorKind::IntegerRange);
        assert_eq!(encode(&Value::Map(vec![(Value::Null, Value::Null)])).unwrap_err().kind, ErrorKind::KeyType);
        let dup = Value::Map(vec![(Value::Int(1), Value::Null), (Value::Int(1), Value::Null)]);
        assert_eq!(encode(&dup).unwrap_err().kind, ErrorKind::DuplicateKey);
        let mut deep = Value::Null;
        for _ in 0..33 {
            deep = Value::Array(vec![deep]);
        }
        assert_eq!(encode(&deep).unwrap_err().kind, ErrorKind::TooDeep);
        let mut out = vec![9u8];
        let small = Limits { max_bytes: 2, ..Limits::DEFAULT };
        assert_eq!(encode_into(&Value::from("abc"), &mut out, &small).unwrap_err().kind, ErrorKind::TooLarge);
        assert_eq!(out, vec![9u8], "a failed encode leaves the output as it was");
        assert_eq!(encode(&Value::Float(1.0)).unwrap(), vec![0xf9, 0x3c, 0x00]);
    }

    #[test]
    fn accessors() {
        let mut v = Value::map([("x", Value::from(5u8))]);
        assert_eq!(v.get("x").and_then(Value::as_u64), Some(5));
        assert_eq!(v.get("x").and_then(Value::as_i64), Some(5));
        assert!(v.get("y").is_none());
        v.insert("x", Value::from("s"));
        v.insert("y", Value::Null);
        assert_eq!(v.get("x").and_then(Value::as_str), Some("s"));
        assert!(v.get("y").unwrap().is_null());
        assert_eq!(Value::Int(-1).as_u64(), None);
        assert_eq!(Value::from(Some(3u32)), Value::Int(3));
        assert_eq!(Value::from(None::<u32>), Value::Null);
    }
}
