//! The stdio transport's guard: every line from the client is checked before the protocol
//! library sees it. JSON-RPC asks for an error reply to a message that is not JSON (`-32700`)
//! or not a request (`-32600`); the library would skip such a line without a word, leaving the
//! client waiting. A line longer than [`MAX_LINE`] is answered the same way and dropped
//! without being held, so a client cannot make the server take unbounded memory.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

/// The longest message read (a tool call is a few hundred bytes; a long OOM message to
/// `explain_message` a few kB).
pub const MAX_LINE: usize = 16 << 20;

/// The library's ends of the guarded transport: it reads checked lines from the first and
/// writes its messages to the second. The tasks that move the bytes run on the current
/// runtime until stdin closes; the third is the stdout writer's, done when every reply is out.
pub fn guarded_stdio() -> (DuplexStream, DuplexStream, tokio::task::JoinHandle<()>) {
    let (mut to_library, library_in) = tokio::io::duplex(1 << 20);
    let (library_out, from_library) = tokio::io::duplex(1 << 20);
    let (lines, mut outgoing) = mpsc::channel::<Vec<u8>>(64);

    // One writer for stdout: the library's messages and the guard's error replies, whole
    // lines each.
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(line) = outgoing.recv().await {
            if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let library_lines = lines.clone();
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::new(from_library);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if library_lines.send(line.clone()).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut pending: Vec<u8> = Vec::new();
        // Set while the rest of an over-long line is skipped.
        let mut skipping = false;
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            let n = match stdin.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut rest = &chunk[..n];
            while let Some(end) = rest.iter().position(|&b| b == b'\n') {
                let (head, tail) = rest.split_at(end);
                rest = &tail[1..];
                if skipping {
                    skipping = false;
                    continue;
                }
                pending.extend_from_slice(head);
                let message = std::mem::take(&mut pending);
                match check(&message) {
                    Ok(()) => {
                        let mut forwarded = message;
                        forwarded.push(b'\n');
                        if to_library.write_all(&forwarded).await.is_err() {
                            return;
                        }
                    }
                    Err(Some(reply)) => {
                        if lines.send(reply).await.is_err() {
                            return;
                        }
                    }
                    Err(None) => {}
                }
            }
            if !skipping {
                pending.extend_from_slice(rest);
                if pending.len() > MAX_LINE {
                    pending = Vec::new();
                    skipping = true;
                    let reply = error_reply(
                        serde_json::Value::Null,
                        -32700,
                        &format!("Parse error: a message longer than {MAX_LINE} bytes"),
                    );
                    if lines.send(reply).await.is_err() {
                        return;
                    }
                }
            }
        }
        // The client closed stdin: the library sees the end of its input and stops.
        let _ = to_library.shutdown().await;
    });
    (library_in, library_out, writer)
}

fn error_reply(id: serde_json::Value, code: i64, message: &str) -> Vec<u8> {
    let mut out = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    }))
    .unwrap_or_default();
    out.push(b'\n');
    out
}

/// `Ok` for a line to hand on; else the error reply it gets (`None`: a blank line, ignored).
fn check(line: &[u8]) -> Result<(), Option<Vec<u8>>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(None);
    }
    let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
        Some(error_reply(
            serde_json::Value::Null,
            -32700,
            &format!("Parse error: {e}"),
        ))
    })?;
    let object = value.as_object();
    let id = object
        .and_then(|o| o.get("id"))
        .cloned()
        .unwrap_or(serde_json::Value::Null);
    let valid = object.is_some_and(|o| {
        o.get("jsonrpc").and_then(|v| v.as_str()) == Some("2.0")
            && (o.get("method").is_some_and(|m| m.is_string())
                || o.contains_key("result")
                || o.contains_key("error"))
    });
    match valid {
        true => Ok(()),
        false => Err(Some(error_reply(
            id,
            -32600,
            "Invalid Request: expected a JSON-RPC 2.0 object with a method",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(line: &str) -> serde_json::Value {
        match check(line.as_bytes()) {
            Err(Some(r)) => serde_json::from_slice(&r).unwrap(),
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn requests_pass_and_everything_else_gets_the_json_rpc_error() {
        assert!(check(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).is_ok());
        assert!(check(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_ok());
        assert_eq!(check(b"  \r"), Err(None));
        assert_eq!(reply("{not json")["error"]["code"], -32700);
        assert_eq!(reply("{not json")["id"], serde_json::Value::Null);
        let r = reply(r#"{"id":7,"method":"x"}"#);
        assert_eq!(
            (r["error"]["code"].as_i64(), r["id"].as_i64()),
            (Some(-32600), Some(7))
        );
        assert_eq!(reply("[1,2]")["error"]["code"], -32600);
    }
}
