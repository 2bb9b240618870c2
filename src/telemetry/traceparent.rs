//! W3C Trace Context's `traceparent` header (version `00`): `00-<trace id>-<parent span id>-<flags>`, lowercase
//! hex. An incoming one names the caller's span, which becomes the parent of the server's span; the response
//! carries the server span's own.

use opentelemetry::{SpanId, TraceId};

/// The header's name, as HTTP/2 and gRPC metadata spell it.
pub const HEADER: &str = "traceparent";

/// A span as a `traceparent` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The caller sampled its span (flag bit 0): a parent-based sampler follows it.
    pub sampled: bool,
}

/// Reads a `traceparent` value; `None` when it is not one (the request then starts a trace of its own, as the
/// specification asks). A version other than `00` is read as far as `00` defines it.
pub fn parse(value: &[u8]) -> Option<Parent> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let mut parts = text.split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let span = parts.next()?;
    let flags = parts.next()?;
    let version = hex::<1>(version)?[0];
    // Version ff is invalid; version 00 has exactly four fields, a later one may have more.
    if version == 0xff || (version == 0 && parts.next().is_some()) {
        return None;
    }
    let trace_id = u128::from_be_bytes(hex::<16>(trace)?);
    let span_id = u64::from_be_bytes(hex::<8>(span)?);
    let flags = hex::<1>(flags)?[0];
    if trace_id == 0 || span_id == 0 {
        return None;
    }
    Some(Parent {
        trace_id: TraceId::from_bytes(trace_id.to_be_bytes()),
        span_id: SpanId::from_bytes(span_id.to_be_bytes()),
        sampled: flags & 1 == 1,
    })
}

/// The `traceparent` value naming span `span_id` of trace `trace_id`.
pub fn format(trace_id: TraceId, span_id: SpanId, sampled: bool) -> String {
    format!(
        "00-{}-{}-{:02x}",
        hex_string(&trace_id.to_bytes()),
        hex_string(&span_id.to_bytes()),
        u8::from(sampled)
    )
}

/// Lowercase hex of `bytes`.
pub fn hex_string(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// `N` bytes from exactly `2 N` lowercase hex digits.
fn hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_the_specifications_example_and_writes_it_back() {
        let parent = parse(EXAMPLE.as_bytes()).expect("valid");
        assert!(parent.sampled);
        assert_eq!(
            format(parent.trace_id, parent.span_id, parent.sampled),
            EXAMPLE
        );
        let unsampled =
            parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").expect("valid");
        assert!(!unsampled.sampled);
    }

    #[test]
    fn refuses_what_is_not_a_traceparent() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse(bad.as_bytes()), None, "{bad:?}");
        }
        assert!(
            parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later").is_some(),
            "a later version may carry more fields"
        );
    }
}
