//! stdio: a child process speaking newline-delimited JSON-RPC.

use std::process::Stdio;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::{ClientError, RequestMetaBuilder};

/// A server running as a child process.
pub struct StdioClient {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Lines<BufReader<ChildStdout>>,
    /// What every request's `_meta` carries.
    pub meta: RequestMetaBuilder,
}

impl StdioClient {
    /// Starts `program` with `args`; its stderr is inherited.
    pub fn spawn(program: &str, args: &[&str]) -> Result<Self, ClientError> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| ClientError::Protocol("no stdout".into()))?;
        Ok(StdioClient {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            meta: RequestMetaBuilder::default(),
        })
    }

    /// Writes one message.
    pub async fn send(&mut self, message: &Value) -> Result<(), ClientError> {
        self.send_line(message.to_string()).await
    }

    /// Writes `line` as it is, then a newline: for testing how a server takes bytes that
    /// are not a message.
    pub async fn send_line(&mut self, line: impl AsRef<[u8]>) -> Result<(), ClientError> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| ClientError::Protocol("stdin is closed".into()))?;
        stdin.write_all(line.as_ref()).await?;
        stdin.write_all(b"\n").await?;
        stdin.flush().await?;
        Ok(())
    }

    /// Writes a request with `_meta` filled in.
    pub async fn request(
        &mut self,
        id: Value,
        method: &str,
        params: Value,
    ) -> Result<(), ClientError> {
        let params = self.meta.apply(params);
        self.send(&json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }))
            .await
    }

    /// Reads the next message; `None` at end of output.
    pub async fn recv(&mut self) -> Result<Option<Value>, ClientError> {
        match self.lines.next_line().await? {
            Some(line) => serde_json::from_str(&line)
                .map(Some)
                .map_err(|e| ClientError::Protocol(format!("{e}: {line}"))),
            None => Ok(None),
        }
    }

    /// Closes the server's stdin.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the process to exit.
    pub async fn wait(&mut self) -> Result<std::process::ExitStatus, ClientError> {
        Ok(self.child.wait().await?)
    }
}
