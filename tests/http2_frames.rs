//! Fuzzing of HTTP/2 frames, end to end: sequences of raw frames (after the client preface, mostly valid in their
//! framing, with requests the server serves, and with their fields, lengths, flags, stream ids and bytes broken the
//! ways a hostile client would break them) are written to both listeners (HTTP, where h2c is spoken by prior
//! knowledge, and gRPC) of a server running in this process. For every sequence the server must close the
//! connection within a bound once the client has sent everything and closed its side, send a bounded number of
//! bytes, and never panic (a panic hook counts panics anywhere in the process, including the connection tasks that
//! would otherwise swallow one). Every [`HEALTH_EVERY`] inputs, and at the end, a normal client must get the same
//! answer as before the fuzzing began.
//!
//! The frames are parsed by the `h2` crate; this target checks what recserve builds on it (the connection layer,
//! its timeouts and limits, the routes and decoders behind them) holds under malformed HTTP/2. Inputs:
//! [`recserve_core::testing::fuzz::cases`] ÷ 10 (each is a connection), so `RECSERVE_FUZZ_CASES` scales it.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{TestServer, config, fixture_repo};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const RANK: &str = "/v1/models/deepfm-int8/rank";
const RECALL: &str = "/v1/models/lightgcn/recall";
const INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
/// The server must have closed a connection this long after the client closed its side.
const CLOSE_WITHIN: Duration = Duration::from_secs(20);
/// What one input may make the server send (answers to at most a few dozen requests of the fixture's models).
const MAX_REPLY_BYTES: usize = 8 << 20;
const HEALTH_EVERY: u32 = 50;
/// The client closes its side once the server has sent nothing for this long.
const QUIET: Duration = Duration::from_millis(30);

// Frame types (RFC 9113 §6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// One frame: its header's fields and its payload. `length`, when given, is written in place of the payload's
/// length (a frame that lies about its size).
#[derive(Debug, Clone)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    length: Option<u32>,
    payload: Vec<u8>,
}

impl Frame {
    fn encode(&self, out: &mut Vec<u8>) {
        let length = self.length.unwrap_or(self.payload.len() as u32) & 0xFF_FFFF;
        out.extend_from_slice(&length.to_be_bytes()[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&(self.stream & 0x7FFF_FFFF).to_be_bytes());
        out.extend_from_slice(&self.payload);
    }
}

/// A part of what one input writes: a request on the next stream of the connection, or a frame as it is.
#[derive(Debug, Clone)]
enum Piece {
    Request {
        fields: Vec<(String, String)>,
        body: Vec<u8>,
        /// DATA frames the body is split into (none: the HEADERS frame ends the stream).
        chunks: u8,
    },
    Frame(Frame),
}

/// What one input writes: the preface (or a broken one), its pieces, then byte-level damage to the whole.
#[derive(Debug, Clone)]
struct Input {
    grpc: bool,
    preface: Vec<u8>,
    pieces: Vec<Piece>,
    /// (position ÷ 2^16 of the length, new byte) pairs overwriting the encoded bytes.
    flips: Vec<(u16, u8)>,
    /// Cut the encoded bytes to this fraction ÷ 2^16 of their length.
    cut: Option<u16>,
}

impl Input {
    fn bytes(&self) -> Vec<u8> {
        let mut out = self.preface.clone();
        let mut next = 1u32;
        for piece in &self.pieces {
            match piece {
                Piece::Frame(frame) => frame.encode(&mut out),
                Piece::Request {
                    fields,
                    body,
                    chunks,
                } => {
                    let stream = next;
                    next += 2;
                    let flags = if *chunks == 0 {
                        END_HEADERS | END_STREAM
                    } else {
                        END_HEADERS
                    };
                    let frame = |kind, flags, payload| Frame {
                        kind,
                        flags,
                        stream,
                        length: None,
                        payload,
                    };
                    frame(HEADERS, flags, hpack(fields)).encode(&mut out);
                    let size = body.len().div_ceil(usize::from(*chunks).max(1)).max(1);
                    let parts: Vec<&[u8]> = body.chunks(size).collect();
                    for i in 0..usize::from(*chunks) {
                        let last = i + 1 == usize::from(*chunks);
                        let part = parts.get(i).copied().unwrap_or_default().to_vec();
                        frame(DATA, if last { END_STREAM } else { 0 }, part).encode(&mut out);
                    }
                }
            }
        }
        let at = |fraction: u16, len: usize| (len * usize::from(fraction)) >> 16;
        for &(position, byte) in &self.flips {
            let i = at(position, out.len());
            if i < out.len() {
                out[i] = byte;
            }
        }
        if let Some(cut) = self.cut {
            out.truncate(at(cut, out.len()));
        }
        out
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1), the prefix's other bits `first`.
fn hpack_int(first: u8, n: u32, mut value: usize, out: &mut Vec<u8>) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    value -= max;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// A header block of literal fields without indexing, new names (RFC 7541 §6.2.2).
fn hpack(fields: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        hpack_int(0, 7, name.len(), &mut out);
        out.extend_from_slice(name.as_bytes());
        hpack_int(0, 7, value.len(), &mut out);
        out.extend_from_slice(value.as_bytes());
    }
    out
}

fn stream_id() -> BoxedStrategy<u32> {
    prop_oneof![
        6 => (0u32..6).prop_map(|i| 2 * i + 1),
        1 => Just(0u32),
        1 => (1u32..6).prop_map(|i| 2 * i),
        1 => any::<u32>(),
        1 => Just(0x7FFF_FFFF),
    ]
    .boxed()
}

/// A request's header fields: a served path (or not), its method, content type and length, sometimes a field
/// too many, too long, repeated or not allowed in HTTP/2.
fn request_fields(grpc: bool) -> BoxedStrategy<Vec<(String, String)>> {
    let path = prop_oneof![
        6 => Just(if grpc { INFER } else { RANK }.to_owned()),
        2 => Just(RECALL.to_owned()),
        1 => Just("/v2/health/ready".to_owned()),
        1 => Just("/metrics".to_owned()),
        1 => "/[a-z/%0-9]{0,20}",
        1 => Just(String::new()),
    ];
    let method = prop_oneof![
        8 => Just("POST"),
        1 => prop::sample::select(vec!["GET", "PUT", "CONNECT", ""]),
    ];
    let extra = prop_oneof![
        Just(("content-length".to_owned(), "0".to_owned())),
        Just(("content-length".to_owned(), "99999999999".to_owned())),
        (0u32..4000).prop_map(|n| ("content-length".to_owned(), n.to_string())),
        Just(("connection".to_owned(), "keep-alive".to_owned())),
        Just(("te".to_owned(), "trailers".to_owned())),
        Just(("transfer-encoding".to_owned(), "chunked".to_owned())),
        Just((":path".to_owned(), RANK.to_owned())),
        Just((":status".to_owned(), "200".to_owned())),
        Just(("Upper-Case".to_owned(), "x".to_owned())),
        Just(("grpc-timeout".to_owned(), "1m".to_owned())),
        Just(("x-recserve-deadline-ms".to_owned(), "0".to_owned())),
        (1usize..20_000).prop_map(|n| ("x-long".to_owned(), "v".repeat(n))),
    ];
    let extras = prop_oneof![6 => Just(Vec::new()), 1 => vec(extra, 1..3)];
    (path, method, prop::bool::weighted(0.95), extras)
        .prop_map(move |(path, method, scheme, extra)| {
            let mut fields = vec![
                (":method".to_owned(), method.to_owned()),
                (":scheme".to_owned(), "http".to_owned()),
                (":path".to_owned(), path),
                (":authority".to_owned(), "test".to_owned()),
            ];
            if !scheme {
                fields.remove(1);
            }
            let content_type = if grpc {
                "application/grpc"
            } else {
                "application/json"
            };
            fields.push(("content-type".to_owned(), content_type.to_owned()));
            if grpc {
                fields.push(("te".to_owned(), "trailers".to_owned()));
            }
            fields.extend(extra);
            fields
        })
        .boxed()
}

/// A request body: valid JSON for the routes, a gRPC message prefix with a payload, or bytes.
fn body(grpc: bool) -> BoxedStrategy<Vec<u8>> {
    let rank =
        std::fs::read("docs/examples/rank-request.json").expect("docs/examples/rank-request.json");
    prop_oneof![
        2 => Just(if grpc {
            let mut m = vec![0u8, 0, 0, 0, 4];
            m.extend_from_slice(b"\x0a\x02mm");
            m
        } else {
            rank
        }),
        1 => Just(br#"{"user_id": 3, "k": 20}"#.to_vec()),
        1 => (any::<bool>(), any::<u32>(), vec(any::<u8>(), 0..64)).prop_map(|(c, n, p)| {
            let mut m = vec![u8::from(c)];
            m.extend_from_slice(&n.to_be_bytes());
            m.extend_from_slice(&p);
            m
        }),
        1 => vec(any::<u8>(), 0..300),
    ]
    .boxed()
}

fn settings() -> BoxedStrategy<Vec<u8>> {
    let value = prop_oneof![
        Just(0u32),
        Just(1),
        Just(16_384),
        Just(16_777_215),
        Just(16_777_216),
        Just(0x7FFF_FFFF),
        Just(0x8000_0000),
        Just(u32::MAX),
        any::<u32>(),
    ];
    vec((prop_oneof![1u16..=8, any::<u16>()], value), 0..6)
        .prop_map(|entries| {
            let mut out = Vec::new();
            for (id, v) in entries {
                out.extend_from_slice(&id.to_be_bytes());
                out.extend_from_slice(&v.to_be_bytes());
            }
            out
        })
        .boxed()
}

fn frame(grpc: bool) -> BoxedStrategy<Frame> {
    let u32_edge = prop_oneof![
        Just(0u32),
        Just(1),
        Just(65_535),
        Just(0x7FFF_FFFF),
        Just(u32::MAX),
        any::<u32>()
    ];
    let payload = prop_oneof![
        4 => request_fields(grpc).prop_map(|f| (HEADERS, END_HEADERS, hpack(&f))),
        1 => (request_fields(grpc), any::<u8>()).prop_map(|(f, flags)| (HEADERS, flags, hpack(&f))),
        1 => vec(any::<u8>(), 0..40).prop_map(|b| (HEADERS, END_HEADERS, b)),
        1 => request_fields(grpc).prop_map(|f| (CONTINUATION, END_HEADERS, hpack(&f))),
        1 => vec(any::<u8>(), 0..40).prop_map(|b| (CONTINUATION, 0, b)),
        4 => body(grpc).prop_map(|b| (DATA, END_STREAM, b)),
        1 => (body(grpc), any::<u8>()).prop_map(|(b, flags)| (DATA, flags, b)),
        2 => settings().prop_map(|b| (SETTINGS, 0, b)),
        1 => Just((SETTINGS, 0x1, Vec::new())),
        2 => u32_edge.clone().prop_map(|n| (WINDOW_UPDATE, 0, n.to_be_bytes().to_vec())),
        1 => u32_edge.clone().prop_map(|n| (RST_STREAM, 0, n.to_be_bytes().to_vec())),
        1 => (any::<[u8; 8]>(), any::<bool>()).prop_map(|(b, ack)| (PING, u8::from(ack), b.to_vec())),
        1 => (u32_edge.clone(), any::<u8>()).prop_map(|(dep, weight)| {
            let mut b = dep.to_be_bytes().to_vec();
            b.push(weight);
            (PRIORITY, 0, b)
        }),
        1 => (u32_edge.clone(), u32_edge, vec(any::<u8>(), 0..20)).prop_map(|(last, code, debug)| {
            let mut b = last.to_be_bytes().to_vec();
            b.extend_from_slice(&code.to_be_bytes());
            b.extend_from_slice(&debug);
            (GOAWAY, 0, b)
        }),
        1 => vec(any::<u8>(), 0..40).prop_map(|b| (PUSH_PROMISE, END_HEADERS, b)),
        1 => (10u8..=255, any::<u8>(), vec(any::<u8>(), 0..40)).prop_map(|(kind, flags, b)| (kind, flags, b)),
    ];
    let length = prop_oneof![
        12 => Just(None),
        1 => Just(Some(0)),
        1 => Just(Some(16_385)),
        1 => Just(Some(0xFF_FFFF)),
        1 => (0u32..64).prop_map(Some),
    ];
    (payload, stream_id(), length)
        .prop_map(|((kind, flags, payload), stream, length)| Frame {
            kind,
            flags,
            stream,
            length,
            payload,
        })
        .boxed()
}

/// Control frames as a well-behaved client sends them.
fn benign() -> BoxedStrategy<Frame> {
    let frame = |kind, flags, stream, payload| Frame {
        kind,
        flags,
        stream,
        length: None,
        payload,
    };
    prop_oneof![
        any::<[u8; 8]>().prop_map(move |b| frame(PING, 0, 0, b.to_vec())),
        (1u32..1 << 20).prop_map(move |n| frame(WINDOW_UPDATE, 0, 0, n.to_be_bytes().to_vec())),
        (1u32..4, 1u32..1 << 20).prop_map(move |(s, n)| frame(
            WINDOW_UPDATE,
            0,
            2 * s - 1,
            n.to_be_bytes().to_vec()
        )),
        (1u32..4).prop_map(move |s| frame(RST_STREAM, 0, 2 * s - 1, 8u32.to_be_bytes().to_vec())),
        (16_384u32..1 << 20).prop_map(move |size| {
            let mut b = 5u16.to_be_bytes().to_vec();
            b.extend_from_slice(&size.to_be_bytes());
            frame(SETTINGS, 0, 0, b)
        }),
        Just(frame(SETTINGS, 0x1, 0, Vec::new())),
    ]
    .boxed()
}

fn piece(grpc: bool) -> BoxedStrategy<Piece> {
    let request = (request_fields(grpc), body(grpc), 0u8..4).prop_map(|(fields, body, chunks)| {
        Piece::Request {
            fields,
            body,
            chunks,
        }
    });
    prop_oneof![
        6 => request,
        2 => benign().prop_map(Piece::Frame),
        1 => frame(grpc).prop_map(Piece::Frame),
    ]
    .boxed()
}

fn input() -> impl Strategy<Value = Input> {
    any::<bool>().prop_flat_map(|grpc| {
        let preface = prop_oneof![
            20 => Just(PREFACE.to_vec()),
            1 => vec(any::<u8>(), 0..30),
            1 => (0usize..PREFACE.len()).prop_map(|n| PREFACE[..n].to_vec()),
        ];
        let settings = Piece::Frame(Frame {
            kind: SETTINGS,
            flags: 0,
            stream: 0,
            length: None,
            payload: Vec::new(),
        });
        let opening = prop_oneof![6 => Just(vec![settings]), 1 => Just(Vec::new())];
        let flips = prop_oneof![8 => Just(Vec::new()), 1 => vec((any::<u16>(), any::<u8>()), 1..4)];
        let cut = prop_oneof![8 => Just(None), 1 => any::<u16>().prop_map(Some)];
        (preface, opening, vec(piece(grpc), 0..8), flips, cut).prop_map(
            move |(preface, mut pieces, more, flips, cut)| {
                pieces.extend(more);
                Input {
                    grpc,
                    preface,
                    pieces,
                    flips,
                    cut,
                }
            },
        )
    })
}

/// How many response heads (HEADERS frames on a stream) the server's bytes hold, read as HTTP/2 frames.
fn response_heads(mut reply: &[u8]) -> usize {
    let mut heads = 0;
    while reply.len() >= 9 {
        let length = u32::from_be_bytes([0, reply[0], reply[1], reply[2]]) as usize;
        let stream = u32::from_be_bytes([reply[5], reply[6], reply[7], reply[8]]) & 0x7FFF_FFFF;
        if reply[3] == HEADERS && stream != 0 {
            heads += 1;
        }
        reply = &reply[(9 + length).min(reply.len())..];
    }
    heads
}

/// Writes `bytes`, closes the write side, and reads until the server closes: what it sent.
async fn exchange(addr: std::net::SocketAddr, bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let exchange = async {
        let mut got = Vec::new();
        let mut chunk = [0u8; 16 << 10];
        // The server may close (GOAWAY and close) before it has read everything: a failed write is an answer too.
        if stream.write_all(bytes).await.is_ok() {
            // Its answers first (an HTTP/2 server drops the streams in flight when its client's side closes), until
            // it has been quiet for a moment.
            while let Ok(read) = tokio::time::timeout(QUIET, stream.read(&mut chunk)).await {
                match read {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = stream.shutdown().await;
        }
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(CLOSE_WITHIN, exchange)
        .await
        .map_err(|_| {
            format!("the server kept the connection open {CLOSE_WITHIN:?} after the client closed")
        })
}

#[test]
fn fuzz_http2_frames_never_panic_hang_or_disturb_other_clients() {
    let panics = Arc::new(AtomicUsize::new(0));
    {
        let panics = Arc::clone(&panics);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            panics.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = runtime.block_on(TestServer::start(config(&fixture_repo(), |_| {})));
    let rank: serde_json::Value =
        serde_json::from_slice(&std::fs::read("docs/examples/rank-request.json").expect("example"))
            .expect("JSON");
    let (status, expected) = runtime.block_on(server.post(RANK, &rank));
    assert_eq!(status, 200, "{expected}");
    let healthy = || {
        let (status, answer) = runtime.block_on(server.post(RANK, &rank));
        assert_eq!(status, 200, "a normal client was refused: {answer}");
        assert_eq!(answer, expected, "a normal client's answer changed");
    };

    let cases = (recserve_core::testing::fuzz::cases() / 10).max(1);
    let mut runner = TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        max_shrink_time: 60_000,
        ..RunnerConfig::default()
    });
    let done = std::cell::Cell::new(0u32);
    let heads = std::cell::Cell::new(0usize);
    let started = std::time::Instant::now();
    let result = runner.run(&input(), |input| {
        let addr = if input.grpc {
            server.grpc_addr
        } else {
            server.addr
        };
        let reply = runtime
            .block_on(exchange(addr, &input.bytes()))
            .map_err(TestCaseError::fail)?;
        prop_assert!(
            reply.len() <= MAX_REPLY_BYTES,
            "the server sent {} bytes for one input",
            reply.len()
        );
        heads.set(heads.get() + response_heads(&reply));
        prop_assert_eq!(
            panics.load(Ordering::SeqCst),
            0,
            "the server panicked (its message is printed above)"
        );
        done.set(done.get() + 1);
        if done.get().is_multiple_of(HEALTH_EVERY) {
            healthy();
        }
        Ok(())
    });
    eprintln!(
        "fuzz http2 frames: {} inputs ({} response heads) in {:.2} s",
        done.get(),
        heads.get(),
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        panic!("fuzz http2 frames: {e}");
    }
    healthy();
    assert_eq!(panics.load(Ordering::SeqCst), 0, "the server panicked");
    runtime
        .block_on(server.stop())
        .expect("a clean shutdown after the fuzzing");
}
