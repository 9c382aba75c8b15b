//! A plain HTTP GET for the tests' own servers (Prometheus, Chromium's DevTools), read by
//! its `Content-Length` when it has one (DevTools keeps the connection open after its
//! answer even when asked to close it), else to the end, chunked or not (Prometheus's API).

use std::{net::SocketAddr, time::Duration};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// How long one exchange may take.
const PROMPT: Duration = Duration::from_secs(30);

/// `GET path` at `addr`: (status, body).
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    get_with_headers(addr, path).await.map(|(code, _, body)| (code, body))
}

/// `GET path` at `addr`: (status, header lines `name: value`, body).
pub async fn get_with_headers(addr: SocketAddr, path: &str) -> Result<(u16, Vec<String>, String), String> {
    let exchange = async {
        let conn = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
        let mut conn = BufReader::new(conn);
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        conn.get_mut().write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if conn.read_line(&mut line).await.map_err(|e| e.to_string())? == 0 {
                return Err(format!("closed in the headers: {head:?}"));
            }
            if line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let code =
            head.first().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
        let header = |name: &str| {
            head.iter().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let mut body = Vec::new();
        if let Some(len) = header("content-length").and_then(|l| l.parse::<usize>().ok()) {
            body.resize(len, 0);
            conn.read_exact(&mut body).await.map_err(|e| e.to_string())?;
        } else {
            conn.read_to_end(&mut body).await.map_err(|e| e.to_string())?;
            if header("transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
                body = dechunk(&body)?;
            }
        }
        Ok((code, head, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(PROMPT, exchange).await.map_err(|_| format!("no answer within {PROMPT:?}"))?
}

/// A chunked body's data.
fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let end = raw.windows(2).position(|w| w == b"\r\n").ok_or("chunk size line")?;
        let size = std::str::from_utf8(&raw[..end]).map_err(|e| e.to_string())?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|e| e.to_string())?;
        raw = &raw[end + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend(raw.get(..size).ok_or("short chunk")?);
        raw = raw.get(size + 2..).ok_or("chunk end")?;
    }
}
