//! Headless Chromium (Debian's `chromium`) driven over the DevTools protocol: a small CDP
//! client on a hand-written WebSocket (the handshake and client frames of RFC 6455, masked
//! as a client must), so the test needs no crate beyond tokio and serde_json.
//!
//! The DevTools protocol (not `--dump-dom`) is what lets a test watch one page change: it
//! reads the live DOM of the same document again and again, and a value the test plants in
//! the page's `window` at the start proves at the end that the page was never reloaded.

use std::{path::Path, time::Duration};

use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::child::Guarded;

/// How long Chromium gets to start and to answer one command (generous: the whole suite
/// runs next to it on two cores).
const PROMPT: Duration = Duration::from_secs(60);

/// A running headless Chromium with one page attached; killed on drop.
pub struct Browser {
    /// Where its DevTools server listens.
    pub devtools: std::net::SocketAddr,
    socket: TcpStream,
    next_id: u64,
    // Dropped after the socket: the process group is killed, then its profile goes.
    _child: Guarded,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts `chromium` (or `$CHROMIUM`) headless with a fresh profile and attaches to its
    /// first page.
    pub async fn launch() -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let binary = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let mut args: Vec<String> = [
            // As root in a container Chromium refuses to start without --no-sandbox.
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--window-size=1280,900",
            "--hide-scrollbars",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
        ]
        .map(String::from)
        .to_vec();
        args.push(format!("--user-data-dir={}", profile.path().join("profile").display()));
        args.push("about:blank".into());
        let child = Guarded::spawn(&binary, &args, &profile.path().join("chromium.log"));
        // Chromium writes the port it picked (and the browser's path) to this file.
        let port_file = profile.path().join("profile").join("DevToolsActivePort");
        let port = crate::support::poll::poll(PROMPT, "Chromium writes DevToolsActivePort", || {
            std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.lines().next()?.trim().parse::<u16>().ok())
        })
        .await;
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let page = crate::support::poll::poll_async(PROMPT, "Chromium lists its page", || async move {
            let (code, body) = super::http10::get(addr, "/json/list").await.ok()?;
            let targets: Vec<Value> = serde_json::from_str(&body).ok().filter(|_| code == 200)?;
            let page = targets.iter().find(|t| t["type"] == "page")?;
            page["webSocketDebuggerUrl"].as_str().map(str::to_string)
        })
        .await;
        // `ws://127.0.0.1[:port]/devtools/page/<id>`: the path is what the handshake asks for.
        let path =
            page.find("/devtools/").map(|i| page[i..].to_string()).unwrap_or_else(|| panic!("ws url {page}"));
        let socket = handshake(addr, &path).await;
        Browser { devtools: addr, socket, next_id: 0, _child: child, _profile: profile }
    }

    /// Ends Chromium (what dropping does) and checks that it is gone: its DevTools port
    /// refuses connections and no process (the browser, its renderers, its GPU and utility
    /// processes, all started with the profile dir on their command line) is left.
    pub async fn close(self) {
        let (devtools, profile) = (self.devtools, self._profile.path().display().to_string());
        // The check below looks at the right processes: they are there before.
        let running = super::child::processes_mentioning(&profile);
        assert!(running.len() >= 2, "Chromium's processes are found by their profile dir: {running:?}");
        drop(self);
        assert!(TcpStream::connect(devtools).await.is_err(), "Chromium's DevTools port still answers");
        let left = super::child::processes_mentioning(&profile);
        assert!(left.is_empty(), "Chromium processes left behind: {left:?}");
    }

    /// Sends one command and returns its `result` (events that arrive meanwhile are
    /// skipped); panics on a protocol error.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({ "id": id, "method": method, "params": params }).to_string();
        send_text(&mut self.socket, message.as_bytes()).await;
        let answer = tokio::time::timeout(PROMPT, async {
            loop {
                let text = read_message(&mut self.socket).await;
                let value: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("CDP sent {e}: {text}"));
                if value["id"] == id {
                    return value;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no answer to {method} within {PROMPT:?}"));
        if let Some(error) = answer.get("error") {
            panic!("{method} failed: {error}");
        }
        answer["result"].clone()
    }

    /// Opens `url` in the page and waits for its load event's navigation to commit.
    pub async fn navigate(&mut self, url: &str) {
        let result = self.call("Page.navigate", json!({ "url": url })).await;
        assert!(result.get("errorText").is_none(), "navigating to {url}: {result}");
    }

    /// Evaluates `expression` in the page; its value (JSON-serialisable) comes back.
    pub async fn eval(&mut self, expression: &str) -> Value {
        let params = json!({ "expression": expression, "returnByValue": true, "awaitPromise": true });
        let result = self.call("Runtime.evaluate", params).await;
        if let Some(exception) = result.get("exceptionDetails") {
            panic!("{expression} threw: {exception}");
        }
        result["result"]["value"].clone()
    }

    /// Saves a PNG of the page (the whole page, not only the window) at `path`.
    pub async fn screenshot(&mut self, path: &Path) {
        let shot = self
            .call("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": true }))
            .await;
        let data = shot["data"].as_str().expect("screenshot data");
        let png = base64_decode(data);
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is a PNG");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

/// The WebSocket opening handshake on `path`; no Origin header, so Chromium needs no
/// `--remote-allow-origins`.
async fn handshake(addr: std::net::SocketAddr, path: &str) -> TcpStream {
    let mut socket = TcpStream::connect(addr).await.expect("connect to DevTools");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: a2Fma2EtYXNzaWduZXIhIQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.expect("send the handshake");
    // Read byte by byte up to the blank line, so no frame byte is swallowed.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let byte = socket.read_u8().await.expect("handshake answer");
        head.push(byte);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "DevTools refused the WebSocket: {head}");
    socket
}

/// One masked text frame (a client's frames must be masked; the key need not be secret
/// here, nothing between the two ends can be confused by it).
async fn send_text(socket: &mut TcpStream, payload: &[u8]) {
    let mask = [0x5a, 0x13, 0xc7, 0x2e];
    let mut frame = vec![0x81];
    match payload.len() {
        n @ 0..=125 => frame.push(0x80 | n as u8),
        n @ 126..=65535 => {
            frame.push(0x80 | 126);
            frame.extend((n as u16).to_be_bytes());
        }
        n => {
            frame.push(0x80 | 127);
            frame.extend((n as u64).to_be_bytes());
        }
    }
    frame.extend(mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    socket.write_all(&frame).await.expect("send to DevTools");
}

/// The next whole text message (fragments joined); panics on a close frame.
async fn read_message(socket: &mut TcpStream) -> String {
    let mut message = Vec::new();
    loop {
        let first = socket.read_u8().await.expect("read from DevTools");
        let second = socket.read_u8().await.expect("read from DevTools");
        let len = match second & 0x7f {
            126 => u64::from(socket.read_u16().await.expect("length")),
            127 => socket.read_u64().await.expect("length"),
            n => u64::from(n),
        };
        let mask = if second & 0x80 != 0 {
            Some(socket.read_u32().await.expect("mask").to_be_bytes())
        } else {
            None
        };
        let mut payload = vec![0; usize::try_from(len).expect("frame fits in memory")];
        socket.read_exact(&mut payload).await.expect("frame payload");
        if let Some(mask) = mask {
            payload.iter_mut().enumerate().for_each(|(i, b)| *b ^= mask[i % 4]);
        }
        match first & 0x0f {
            0x8 => panic!("DevTools closed the WebSocket"),
            // Pings and pongs carry no message (Chromium does not ping its clients).
            0x9 | 0xa => continue,
            _ => message.extend(payload),
        }
        if first & 0x80 != 0 {
            return String::from_utf8(message).expect("CDP messages are UTF-8");
        }
    }
}

/// Standard base64 (what `Page.captureScreenshot` returns).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let digits: Vec<u8> =
        text.bytes().filter(|c| *c != b'=' && !c.is_ascii_whitespace()).map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, d)| n | (u32::from(*d) << (18 - 6 * i)));
        out.extend(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGVsbG8hIQ=="), b"hello!!");
    assert_eq!(base64_decode("YWJj"), b"abc");
}
