//! Lets standard gRPC clients that send the socket path as `:authority` use the Unix socket.
//!
//! Google's grpcio (Python, and the C core behind Ruby, PHP and C++) sends a
//! Unix socket's path, percent-encoded, as the HTTP/2 `:authority`
//! (`tmp%2Frevis%2Frevisd.sock`). That is not a valid URI authority, and the
//! `h2` server under tonic resets such a stream with PROTOCOL_ERROR before any
//! layer of ours sees the request (hyperium/h2#487). [`AuthorityFix`] wraps
//! each accepted Unix connection and rewrites such an `:authority` to
//! [`REPLACEMENT_AUTHORITY`] on the way in, so `grpc.insecure_channel("unix:PATH")`
//! works as it comes. On a Unix socket the authority names nothing anyway.
//!
//! How: the client→server bytes are parsed as HTTP/2 frames after the
//! connection preface. Every frame passes unchanged except header blocks
//! (HEADERS plus its CONTINUATION frames), which are HPACK-decoded with a
//! decoder that follows the client's encoder (dynamic table, table size
//! updates), and then always re-encoded statelessly: literal fields without
//! indexing, no Huffman, no table size update. The server's decoder therefore
//! never adds an entry to its dynamic table and never sees a reference into
//! it, so it stays consistent whatever the client's encoder does; only our
//! decoder has to track the client's table, and it sees every block. Forwarding
//! unchanged blocks as they came would be cheaper but is not safe once any
//! block has been rewritten (the two tables would differ), so every block is
//! re-encoded. Padding is dropped, the PRIORITY fields are kept, and a block
//! longer than [`OUT_MAX_FRAME_BYTES`] is split into CONTINUATION frames.
//! Server→client bytes pass through untouched. A connection that does not open
//! with the HTTP/2 preface is passed through as it is (the server refuses it).
//!
//! Limits: a header block over [`MAX_HEADER_BLOCK_BYTES`] (as sent or once
//! decoded), a table size over [`HPACK_TABLE_SIZE`], a block that does not
//! decode, or frames that break HTTP/2's header-block rules close the
//! connection with a log line naming the reason; the server would have closed
//! it for all but the first, and the first is far above what the server
//! accepts (hyper's 16 KiB header list).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::Decoder;
use loona_hpack::encoder::encode_integer_into;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::codegen::http::uri::Authority;
use tonic::transport::server::Connected;

/// The `:authority` put in place of one the HTTP/2 server would reject.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";
/// The largest header block buffered, as sent (all its frames' payloads) and
/// as decoded (names, values and HPACK's 32 bytes a field); over it the
/// connection is closed. Four times hyper's header list limit (16 KiB).
pub const MAX_HEADER_BLOCK_BYTES: usize = 64 * 1024;
/// The HPACK dynamic table size the server allows the client's encoder: the
/// protocol's default, which tonic's server never changes. A larger table size
/// update closes the connection (it would be a compression error anyway).
pub const HPACK_TABLE_SIZE: usize = 4096;
/// The largest frame payload written to the server: the smallest
/// SETTINGS_MAX_FRAME_SIZE HTTP/2 allows (RFC 9113 §6.5.2), so every server
/// accepts it whatever it advertises.
pub const OUT_MAX_FRAME_BYTES: usize = 16_384;
/// How much is read from the socket at once.
const READ_CHUNK: usize = 16 * 1024;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
const PRIORITY_LEN: usize = 5;

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("a header block is over {MAX_HEADER_BLOCK_BYTES} bytes (authority::MAX_HEADER_BLOCK_BYTES); closing the connection")]
    BlockTooLarge,
    #[error("malformed HTTP/2 from the client: {0}; closing the connection")]
    Malformed(&'static str),
    #[error("a header block does not decode (HPACK: {0}); closing the connection")]
    Hpack(#[from] loona_hpack::decoder::DecoderError),
}

enum State {
    /// Reading the connection preface; `matched` bytes so far.
    Preface { matched: usize },
    /// Not HTTP/2 with a preface: everything passes through.
    Passthrough,
    /// Reading a frame header.
    FrameHeader { buf: [u8; FRAME_HEADER_LEN], len: usize },
    /// Forwarding `left` more payload bytes of a frame that is not a header block.
    Forward { left: usize },
    /// Collecting a HEADERS or CONTINUATION payload.
    Collect { kind: u8, flags: u8, stream: u32, left: usize, payload: Vec<u8> },
}

/// A header block being collected: its HEADERS frame's fields and the fragments so far.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; PRIORITY_LEN]>,
    fragment: Vec<u8>,
}

/// The client→server half of the rewrite, without I/O: bytes in, bytes out.
pub struct Rewriter {
    state: State,
    block: Option<Block>,
    decoder: Decoder<'static>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(HPACK_TABLE_SIZE);
        Rewriter { state: State::Preface { matched: 0 }, block: None, decoder }
    }
}

impl Rewriter {
    /// Takes the next bytes from the client and appends what the server should see to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        while !input.is_empty() {
            match &mut self.state {
                State::Preface { matched } => {
                    let n = (PREFACE.len() - *matched).min(input.len());
                    if input[..n] != PREFACE[*matched..*matched + n] {
                        self.state = State::Passthrough;
                        continue;
                    }
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    *matched += n;
                    if *matched == PREFACE.len() {
                        self.state = State::FrameHeader { buf: [0; FRAME_HEADER_LEN], len: 0 };
                    }
                }
                State::Passthrough => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                State::FrameHeader { buf, len } => {
                    let n = (FRAME_HEADER_LEN - *len).min(input.len());
                    buf[*len..*len + n].copy_from_slice(&input[..n]);
                    input = &input[n..];
                    *len += n;
                    if *len == FRAME_HEADER_LEN {
                        let header = *buf;
                        self.frame_header(header, out)?;
                    }
                }
                State::Forward { left } => {
                    let n = (*left).min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    *left -= n;
                    if *left == 0 {
                        self.state = State::FrameHeader { buf: [0; FRAME_HEADER_LEN], len: 0 };
                    }
                }
                State::Collect { left, payload, .. } => {
                    let n = (*left).min(input.len());
                    payload.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    *left -= n;
                    if *left == 0 {
                        self.collected(out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn frame_header(&mut self, h: [u8; FRAME_HEADER_LEN], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        let (kind, flags) = (h[3], h[4]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        match &self.block {
            Some(b) if kind != TYPE_CONTINUATION || stream != b.stream => {
                return Err(RewriteError::Malformed("a header block was interrupted by another frame"));
            }
            None if kind == TYPE_CONTINUATION => return Err(RewriteError::Malformed("CONTINUATION without HEADERS")),
            _ => {}
        }
        if kind == TYPE_HEADERS || kind == TYPE_CONTINUATION {
            // Padding and priority fields may come on top of the block itself.
            if len > MAX_HEADER_BLOCK_BYTES + 1 + PRIORITY_LEN + 255 {
                return Err(RewriteError::BlockTooLarge);
            }
            self.state = State::Collect { kind, flags, stream, left: len, payload: Vec::with_capacity(len) };
            if len == 0 {
                self.collected(out)?;
            }
        } else {
            out.extend_from_slice(&h);
            self.state = if len == 0 { State::FrameHeader { buf: [0; FRAME_HEADER_LEN], len: 0 } } else { State::Forward { left: len } };
        }
        Ok(())
    }

    /// A whole HEADERS or CONTINUATION payload is in.
    fn collected(&mut self, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let State::Collect { kind, flags, stream, payload, .. } =
            std::mem::replace(&mut self.state, State::FrameHeader { buf: [0; FRAME_HEADER_LEN], len: 0 })
        else {
            unreachable!("collected() is called in the Collect state");
        };
        if kind == TYPE_HEADERS {
            let mut at = 0;
            let pad = if flags & FLAG_PADDED != 0 {
                at = 1;
                *payload.first().ok_or(RewriteError::Malformed("PADDED HEADERS frame without a pad length"))? as usize
            } else {
                0
            };
            let priority = if flags & FLAG_PRIORITY != 0 {
                let p: [u8; PRIORITY_LEN] = payload
                    .get(at..at + PRIORITY_LEN)
                    .and_then(|s| s.try_into().ok())
                    .ok_or(RewriteError::Malformed("HEADERS frame too short for its priority fields"))?;
                at += PRIORITY_LEN;
                Some(p)
            } else {
                None
            };
            let end = payload
                .len()
                .checked_sub(pad)
                .filter(|&e| e >= at)
                .ok_or(RewriteError::Malformed("HEADERS padding longer than the frame"))?;
            self.block = Some(Block { stream, end_stream: flags & FLAG_END_STREAM != 0, priority, fragment: payload[at..end].to_vec() });
        } else {
            let block = self.block.as_mut().expect("checked in frame_header");
            block.fragment.extend_from_slice(&payload);
        }
        let block = self.block.as_ref().expect("set above");
        if block.fragment.len() > MAX_HEADER_BLOCK_BYTES {
            return Err(RewriteError::BlockTooLarge);
        }
        if flags & FLAG_END_HEADERS != 0 {
            let block = self.block.take().expect("set above");
            self.rewrite(block, out)?;
        }
        Ok(())
    }

    /// Decodes a whole block and writes it out re-encoded, with a bad `:authority` replaced.
    fn rewrite(&mut self, block: Block, out: &mut Vec<u8>) -> Result<(), RewriteError> {
        let mut fields = Vec::new();
        let mut decoded = 0usize;
        self.decoder.decode_with_cb(&block.fragment, |name, value| {
            // Decoding goes on to keep the table in step, but keeps nothing over the limit.
            decoded = decoded.saturating_add(name.len() + value.len() + 32);
            if decoded <= MAX_HEADER_BLOCK_BYTES {
                let value = if &*name == b":authority" && Authority::try_from(&*value).is_err() {
                    REPLACEMENT_AUTHORITY.to_vec()
                } else {
                    value.into_owned()
                };
                fields.push((name.into_owned(), value));
            }
        })?;
        if decoded > MAX_HEADER_BLOCK_BYTES {
            return Err(RewriteError::BlockTooLarge);
        }
        let mut encoded = Vec::with_capacity(decoded);
        for (name, value) in &fields {
            // Literal header field without indexing, new name (RFC 7541 §6.2.2), plain strings.
            encoded.push(0);
            for s in [name, value] {
                encode_integer_into(s.len(), 7, 0, &mut encoded).expect("writing to a Vec");
                encoded.extend_from_slice(s);
            }
        }

        let priority: &[u8] = block.priority.as_ref().map_or(&[], |p| &p[..]);
        let first = encoded.len().min(OUT_MAX_FRAME_BYTES - priority.len());
        let (head, mut rest) = encoded.split_at(first);
        let mut flags = if block.end_stream { FLAG_END_STREAM } else { 0 } | if priority.is_empty() { 0 } else { FLAG_PRIORITY };
        if rest.is_empty() {
            flags |= FLAG_END_HEADERS;
        }
        write_frame_header(out, priority.len() + head.len(), TYPE_HEADERS, flags, block.stream);
        out.extend_from_slice(priority);
        out.extend_from_slice(head);
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rest.len().min(OUT_MAX_FRAME_BYTES));
            rest = tail;
            write_frame_header(out, chunk.len(), TYPE_CONTINUATION, if rest.is_empty() { FLAG_END_HEADERS } else { 0 }, block.stream);
            out.extend_from_slice(chunk);
        }
        Ok(())
    }
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).expect("frames written are at most OUT_MAX_FRAME_BYTES").to_be_bytes();
    out.extend_from_slice(&[len[1], len[2], len[3], kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// A connection whose client→server bytes go through a [`Rewriter`].
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet handed to the reader, from `taken` on.
    pending: Vec<u8>,
    taken: usize,
    scratch: Box<[u8]>,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        AuthorityFix {
            inner,
            rewriter: Rewriter::default(),
            pending: Vec::new(),
            taken: 0,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.taken < this.pending.len() {
                let n = (this.pending.len() - this.taken).min(buf.remaining());
                buf.put_slice(&this.pending[this.taken..this.taken + n]);
                this.taken += n;
                if this.taken == this.pending.len() {
                    this.pending.clear();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut scratch = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut scratch))?;
            let input = scratch.filled();
            if input.is_empty() {
                return Poll::Ready(Ok(()));
            }
            if let Err(e) = this.rewriter.feed(input, &mut this.pending) {
                tracing::warn!("unix socket connection: {e}");
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The peer credentials (and the rest) come from the wrapped stream.
impl<S: Connected> Connected for AuthorityFix<S> {
    type ConnectInfo = S::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use loona_hpack::Encoder;

    use super::*;

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    const SOCKET_AUTHORITY: &[u8] = b"tmp%2Fauthtest%2Frun%2Fs.sock";

    fn request(authority: &[u8]) -> Fields {
        [
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":path", b"/revis.v1.Admin/Status"),
            (b":authority", authority),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", b"grpc-python/1.76.0 grpc-c/51.0.0"),
        ]
        .iter()
        .map(|(n, v)| (n.to_vec(), v.to_vec()))
        .collect()
    }

    fn encode(encoder: &mut Encoder<'_>, fields: &Fields) -> Vec<u8> {
        encoder.encode(fields.iter().map(|(n, v)| (&n[..], &v[..])))
    }

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame_header(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out
    }

    fn headers(stream: u32, block: &[u8]) -> Vec<u8> {
        frame(TYPE_HEADERS, FLAG_END_HEADERS, stream, block)
    }

    fn settings() -> Vec<u8> {
        frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])
    }

    fn data(stream: u32, body: &[u8]) -> Vec<u8> {
        frame(0x0, FLAG_END_STREAM, stream, body)
    }

    fn connection(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut out = PREFACE.to_vec();
        frames.iter().for_each(|f| out.extend_from_slice(f));
        out
    }

    fn rewrite(input: &[u8]) -> Result<Vec<u8>, RewriteError> {
        let mut out = Vec::new();
        Rewriter::default().feed(input, &mut out)?;
        Ok(out)
    }

    struct Frame {
        kind: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    }

    fn frames(mut bytes: &[u8]) -> Vec<Frame> {
        assert_eq!(&bytes[..PREFACE.len()], PREFACE);
        bytes = &bytes[PREFACE.len()..];
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
            out.push(Frame { kind: bytes[3], flags: bytes[4], stream, payload: bytes[9..9 + len].to_vec() });
            bytes = &bytes[9 + len..];
        }
        out
    }

    /// Decodes every header block the server would get, each with a fresh
    /// decoder: it proves the output never relies on the server's table.
    fn server_blocks(out: &[u8]) -> Vec<Fields> {
        let mut blocks = Vec::new();
        let mut block: Option<Vec<u8>> = None;
        for f in frames(out) {
            assert!(f.payload.len() <= OUT_MAX_FRAME_BYTES);
            match f.kind {
                TYPE_HEADERS => {
                    assert!(block.is_none());
                    assert_eq!(f.flags & FLAG_PADDED, 0);
                    let at = if f.flags & FLAG_PRIORITY != 0 { PRIORITY_LEN } else { 0 };
                    block = Some(f.payload[at..].to_vec());
                }
                TYPE_CONTINUATION => block.as_mut().expect("CONTINUATION after HEADERS").extend_from_slice(&f.payload),
                _ => assert!(block.is_none(), "a frame inside a header block"),
            }
            if matches!(f.kind, TYPE_HEADERS | TYPE_CONTINUATION) && f.flags & FLAG_END_HEADERS != 0 {
                let b = block.take().unwrap();
                assert!(b.chunks(1).next().is_none_or(|c| c[0] == 0), "stateless literals only");
                blocks.push(Decoder::new().decode(&b).expect("the rewritten block decodes"));
            }
        }
        assert!(block.is_none(), "an unfinished header block");
        blocks
    }

    fn with_authority(mut fields: Fields, authority: &[u8]) -> Fields {
        fields.iter_mut().filter(|(n, _)| n == b":authority").for_each(|(_, v)| *v = authority.to_vec());
        fields
    }

    #[test]
    fn a_bad_authority_becomes_localhost_and_everything_else_is_kept() {
        let mut enc = Encoder::new();
        let input = connection(&[settings(), headers(1, &encode(&mut enc, &request(SOCKET_AUTHORITY))), data(1, b"\0\0\0\0\0")]);
        let out = rewrite(&input).unwrap();
        assert_eq!(server_blocks(&out), vec![request(b"localhost")]);
        let f = frames(&out);
        assert_eq!(f.len(), 3);
        assert_eq!((f[0].kind, f[0].payload.clone()), (0x4, vec![0, 3, 0, 0, 0, 100]));
        assert_eq!((f[1].kind, f[1].flags, f[1].stream), (TYPE_HEADERS, FLAG_END_HEADERS, 1));
        assert_eq!((f[2].kind, f[2].flags, f[2].stream, &f[2].payload[..]), (0x0, FLAG_END_STREAM, 1, &b"\0\0\0\0\0"[..]));
    }

    #[test]
    fn valid_authorities_are_kept() {
        for authority in [&b"localhost"[..], b"localhost:50051", b"[::1]:7000", b"revis.local"] {
            let out = rewrite(&connection(&[headers(1, &encode(&mut Encoder::new(), &request(authority)))])).unwrap();
            assert_eq!(server_blocks(&out), vec![request(authority)]);
        }
        // An empty one is no authority either.
        let out = rewrite(&connection(&[headers(1, &encode(&mut Encoder::new(), &request(b"")))])).unwrap();
        assert_eq!(server_blocks(&out), vec![request(b"localhost")]);
    }

    /// Encodes every field as a literal with incremental indexing (RFC 7541
    /// §6.2.1), so the client's table holds them all, newest first.
    fn indexing_block(fields: &Fields) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in fields {
            block.push(0x40);
            for s in [name, value] {
                encode_integer_into(s.len(), 7, 0, &mut block).unwrap();
                block.extend_from_slice(s);
            }
        }
        block
    }

    /// Refers to the fields an [`indexing_block`] of `n` fields just added, in their order.
    fn referring_block(n: usize) -> Vec<u8> {
        (0..n).map(|i| 0x80 | (62 + n - 1 - i) as u8).collect()
    }

    #[test]
    fn dynamic_table_references_across_blocks_stay_correct() {
        // Block 1 fills the client's table; block 2 is only references into
        // it; block 3 shrinks the table to 0 and back (size updates, which
        // empty it) and fills it again; block 4 refers to what block 3 added.
        let n = request(SOCKET_AUTHORITY).len();
        let mut third = vec![0x20, 0x3f, 0xe1, 0x1f];
        third.extend(indexing_block(&request(b"other%2Fpath")));
        let input = connection(&[
            headers(1, &indexing_block(&request(SOCKET_AUTHORITY))),
            headers(3, &referring_block(n)),
            headers(5, &third),
            headers(7, &referring_block(n)),
        ]);
        let out = rewrite(&input).unwrap();
        assert_eq!(server_blocks(&out), vec![request(b"localhost"); 4]);
        assert_eq!(frames(&out).iter().map(|f| f.stream).collect::<Vec<_>>(), [1, 3, 5, 7]);

        // Without the size updates block 4 would refer to the entries of block 1 and 3 mixed.
        let mut fields = request(b"other%2Fpath");
        fields.push((b"x-extra".to_vec(), b"1".to_vec()));
        let input = connection(&[
            headers(1, &indexing_block(&request(SOCKET_AUTHORITY))),
            headers(3, &indexing_block(&fields)),
            headers(5, &referring_block(n + 1)),
        ]);
        assert_eq!(server_blocks(&rewrite(&input).unwrap())[2], with_authority(fields, b"localhost"));
    }

    #[test]
    fn huffman_coded_blocks_from_rfc_7541_decode() {
        // RFC 7541 C.4: three requests with Huffman strings and table references.
        let blocks = ["828684418cf1e3c2e5f23a6ba0ab90f4ff", "828684be5886a8eb10649cbf", "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf"];
        let hex = |s: &str| (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect::<Vec<u8>>();
        let input = connection(&blocks.iter().zip([1, 3, 5]).map(|(b, s)| headers(s, &hex(b))).collect::<Vec<_>>());
        let out = rewrite(&input).unwrap();
        let got = server_blocks(&out);
        let field = |n: &str, v: &str| (n.as_bytes().to_vec(), v.as_bytes().to_vec());
        assert_eq!(
            got[2],
            vec![
                field(":method", "GET"),
                field(":scheme", "https"),
                field(":path", "/index.html"),
                field(":authority", "www.example.com"),
                field("custom-key", "custom-value"),
            ]
        );
        assert_eq!(got[1].last(), Some(&field("cache-control", "no-cache")));
    }

    #[test]
    fn continuation_frames_are_joined() {
        let block = encode(&mut Encoder::new(), &request(SOCKET_AUTHORITY));
        let (a, rest) = block.split_at(5);
        let (b, c) = rest.split_at(7);
        let input = connection(&[
            frame(TYPE_HEADERS, FLAG_END_STREAM, 1, a),
            frame(TYPE_CONTINUATION, 0, 1, b),
            frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, c),
            settings(),
        ]);
        let out = rewrite(&input).unwrap();
        assert_eq!(server_blocks(&out), vec![request(b"localhost")]);
        let f = frames(&out);
        assert_eq!((f[0].kind, f[0].flags), (TYPE_HEADERS, FLAG_END_STREAM | FLAG_END_HEADERS));
        assert_eq!(f[1].kind, 0x4);
    }

    #[test]
    fn padding_is_dropped_and_priority_kept() {
        let block = encode(&mut Encoder::new(), &request(SOCKET_AUTHORITY));
        let priority = [0x80, 0, 0, 3, 15];
        let mut payload = vec![7];
        payload.extend(priority);
        payload.extend(&block);
        payload.extend([0; 7]);
        let flags = FLAG_PADDED | FLAG_PRIORITY | FLAG_END_HEADERS | FLAG_END_STREAM;
        let out = rewrite(&connection(&[frame(TYPE_HEADERS, flags, 1, &payload)])).unwrap();
        assert_eq!(server_blocks(&out), vec![request(b"localhost")]);
        let f = &frames(&out)[0];
        assert_eq!(f.flags, FLAG_PRIORITY | FLAG_END_HEADERS | FLAG_END_STREAM);
        assert_eq!(f.payload[..PRIORITY_LEN], priority);

        let too_much_padding = [vec![200], block].concat();
        let e = rewrite(&connection(&[frame(TYPE_HEADERS, FLAG_PADDED | FLAG_END_HEADERS, 1, &too_much_padding)]));
        assert!(matches!(e, Err(RewriteError::Malformed(_))), "{e:?}");
    }

    #[test]
    fn input_split_anywhere_gives_the_same_output() {
        let mut enc = Encoder::new();
        let block = encode(&mut enc, &request(SOCKET_AUTHORITY));
        let (a, b) = block.split_at(9);
        let input = connection(&[
            settings(),
            frame(TYPE_HEADERS, 0, 1, a),
            frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, b),
            data(1, &[0, 0, 0, 0, 3, 1, 2, 3]),
            headers(3, &encode(&mut enc, &request(SOCKET_AUTHORITY))),
            frame(0x8, 0, 0, &[0, 0, 1, 0]),
        ]);
        let whole = rewrite(&input).unwrap();
        for step in [1, 2, 3, 7, 10, 25] {
            let mut rewriter = Rewriter::default();
            let mut out = Vec::new();
            input.chunks(step).for_each(|c| rewriter.feed(c, &mut out).unwrap());
            assert_eq!(out, whole, "fed {step} bytes at a time");
        }
        assert_eq!(server_blocks(&whole), vec![request(b"localhost"); 2]);
    }

    #[test]
    fn a_long_block_is_split_into_frames_the_server_accepts() {
        let mut fields = request(SOCKET_AUTHORITY);
        fields.push((b"x-big".to_vec(), vec![b'a'; 40_000]));
        let block = encode(&mut Encoder::new(), &fields);
        let chunks: Vec<_> = block.chunks(OUT_MAX_FRAME_BYTES).collect();
        let mut input = vec![frame(TYPE_HEADERS, FLAG_PRIORITY, 1, &[[0, 0, 0, 1, 5].as_slice(), chunks[0]].concat())];
        for (i, c) in chunks[1..].iter().enumerate() {
            input.push(frame(TYPE_CONTINUATION, if i + 2 == chunks.len() { FLAG_END_HEADERS } else { 0 }, 1, c));
        }
        let out = rewrite(&connection(&input)).unwrap();
        assert_eq!(server_blocks(&out), vec![with_authority(fields, b"localhost")]);
        let f = frames(&out);
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].payload.len(), OUT_MAX_FRAME_BYTES);
        assert_eq!(f.iter().map(|f| f.flags & FLAG_END_HEADERS).collect::<Vec<_>>(), [0, 0, FLAG_END_HEADERS]);
    }

    #[test]
    fn blocks_over_the_limit_close_the_connection() {
        // As sent: CONTINUATION frames adding up to more than the limit.
        let mut input = vec![frame(TYPE_HEADERS, 0, 1, &[0x82])];
        input.extend((0..5).map(|_| frame(TYPE_CONTINUATION, 0, 1, &[0x82; 16_000])));
        assert!(matches!(rewrite(&connection(&input)), Err(RewriteError::BlockTooLarge)));
        // One frame announcing more than the limit is refused before its payload comes.
        let mut header = Vec::new();
        write_frame_header(&mut header, 1 << 20, TYPE_HEADERS, FLAG_END_HEADERS, 1);
        assert!(matches!(rewrite(&connection(&[header])), Err(RewriteError::BlockTooLarge)));
        // As decoded: a small block that refers to one big table entry again and again.
        let mut block = vec![0x40, 5];
        block.extend(b"x-big");
        encode_integer_into(3000, 7, 0, &mut block).unwrap();
        block.extend([b'a'; 3000]);
        block.extend([0xbe; 30]);
        assert!(block.len() < MAX_HEADER_BLOCK_BYTES);
        assert!(matches!(rewrite(&connection(&[headers(1, &block)])), Err(RewriteError::BlockTooLarge)));
        // A table larger than the server allows.
        let e = rewrite(&connection(&[headers(1, &[0x3f, 0xe2, 0x1f, 0x82])]));
        assert!(matches!(e, Err(RewriteError::Hpack(_))), "{e:?}");
    }

    #[test]
    fn broken_header_block_sequences_close_the_connection() {
        let interrupted = [frame(TYPE_HEADERS, 0, 1, &[0x82]), settings()];
        assert!(matches!(rewrite(&connection(&interrupted)), Err(RewriteError::Malformed(_))));
        let other_stream = [frame(TYPE_HEADERS, 0, 1, &[0x82]), frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 3, &[0x84])];
        assert!(matches!(rewrite(&connection(&other_stream)), Err(RewriteError::Malformed(_))));
        let orphan = [frame(TYPE_CONTINUATION, FLAG_END_HEADERS, 1, &[0x82])];
        assert!(matches!(rewrite(&connection(&orphan)), Err(RewriteError::Malformed(_))));
        assert!(matches!(rewrite(&connection(&[headers(1, &[0xff, 0xff])])), Err(RewriteError::Hpack(_))));
    }

    #[test]
    fn anything_but_http2_passes_through() {
        let input = b"GET / HTTP/1.1\r\nHost: tmp%2Fs.sock\r\n\r\n";
        assert_eq!(rewrite(input).unwrap(), input);
        let mut rewriter = Rewriter::default();
        let mut out = Vec::new();
        rewriter.feed(b"PRI * HTTP/2.0\r\n", &mut out).unwrap();
        rewriter.feed(b"\r\nXX and more", &mut out).unwrap();
        assert_eq!(out, b"PRI * HTTP/2.0\r\n\r\nXX and more");
    }

    #[tokio::test]
    async fn the_stream_wrapper_rewrites_what_is_read_and_passes_writes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut enc = Encoder::new();
        let input = connection(&[settings(), headers(1, &encode(&mut enc, &request(SOCKET_AUTHORITY))), data(1, &[1; 40_000])]);
        let expected = rewrite(&input).unwrap();
        let (mut client, server) = tokio::io::duplex(64);
        let mut server = AuthorityFix::new(server);
        let writer = tokio::spawn(async move {
            for c in input.chunks(1000) {
                client.write_all(c).await.unwrap();
            }
            let mut reply = [0; 5];
            client.read_exact(&mut reply).await.unwrap();
            assert_eq!(&reply, b"hello");
        });
        server.write_all(b"hello").await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got, expected);
    }
}
