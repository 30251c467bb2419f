//! Test helpers (feature `testing`): a hostile registry on loopback that answers each
//! request as a test says (endless bodies, wrong `Content-Length`s, a body that trickles),
//! counting the bytes it manages to send.
#![allow(clippy::unwrap_used)] // test support: a failure here is a failed test

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use crate::registry::hex;

/// What the server answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A whole response.
    Full {
        /// The status code.
        status: u16,
        /// Headers besides `Content-Length` and `Connection`.
        headers: Vec<(String, String)>,
        /// The body.
        body: Vec<u8>,
    },
    /// `200`, chunked, zeros without end.
    Endless,
    /// `200` declaring `length` bytes and sending `sent` of them, then closing.
    Short {
        /// The declared length.
        length: u64,
        /// What is sent.
        sent: Vec<u8>,
    },
    /// `200` declaring `length` bytes, sending `sent` of them, then nothing, the
    /// connection kept open.
    Stall {
        /// The declared length.
        length: u64,
        /// What is sent.
        sent: Vec<u8>,
    },
    /// `200` declaring `length` bytes, sending one every `every`.
    Trickle {
        /// The declared length.
        length: u64,
        /// The pause before each byte.
        every: Duration,
    },
}

/// `200` with `body`.
pub fn ok(body: Vec<u8>) -> Reply {
    Reply::Full {
        status: 200,
        headers: Vec::new(),
        body,
    }
}

/// `404` as a registry answers it.
pub fn not_found() -> Reply {
    Reply::Full {
        status: 404,
        headers: Vec::new(),
        body: br#"{"errors":[{"code":"MANIFEST_UNKNOWN"}]}"#.to_vec(),
    }
}

type Handler = Arc<dyn Fn(&str, &str) -> Reply + Send + Sync>;

/// A hostile registry on loopback, answering each request as its handler says.
#[derive(Debug)]
pub struct Hostile {
    addr: SocketAddr,
    /// Bytes written to clients, all connections.
    sent: Arc<AtomicU64>,
}

impl Hostile {
    /// Serve on a free loopback port; the handler gets each request's method and path.
    pub async fn start(handler: impl Fn(&str, &str) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent = Arc::new(AtomicU64::new(0));
        let handler: Handler = Arc::new(handler);
        let counter = Arc::clone(&sent);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, Arc::clone(&handler), Arc::clone(&counter)));
            }
        });
        Self { addr, sent }
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Bytes written to clients so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }
}

async fn serve(mut stream: TcpStream, handler: Handler, sent: Arc<AtomicU64>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let reply = handler(&method, &path);
    let mut write = async |bytes: &[u8]| -> bool {
        let ok = stream.write_all(bytes).await.is_ok();
        if ok {
            sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        }
        ok
    };
    match reply {
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let mut text = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                let _ = write!(text, "{k}: {v}\r\n");
            }
            text.push_str("\r\n");
            if write(text.as_bytes()).await && method != "HEAD" {
                write(&body).await;
            }
        }
        Reply::Endless => {
            let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
            if !write(head.as_bytes()).await {
                return;
            }
            let mut chunk = b"10000\r\n".to_vec();
            chunk.extend(std::iter::repeat_n(b'0', 0x10000));
            chunk.extend_from_slice(b"\r\n");
            while write(&chunk).await {}
        }
        Reply::Short { length, sent: body } => {
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n");
            if write(head.as_bytes()).await {
                write(&body).await;
            }
        }
        Reply::Stall { length, sent: body } => {
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n");
            if write(head.as_bytes()).await && write(&body).await {
                // Hold the connection until the client gives up on it.
                let mut buf = [0u8; 1024];
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
            }
        }
        Reply::Trickle { length, every } => {
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n");
            if !write(head.as_bytes()).await {
                return;
            }
            for _ in 0..length {
                tokio::time::sleep(every).await;
                if !write(b"0").await {
                    return;
                }
            }
        }
    }
}

/// A gzip tar of `files` (path, content), regular files of mode 0644.
pub fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        tar.append_data(&mut header, path, *data).unwrap();
    }
    tar.into_inner().unwrap().finish().unwrap()
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}
