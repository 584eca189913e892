//! Running `specd` roles as real processes in tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Kills the process when the test ends, however it ends.
pub struct Running(pub Child);

impl Running {
    /// Kills the process now (SIGKILL: no chance to clean up, as when a machine dies).
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `specd ARGS` with `envs`, waits for its `listening on HOST:PORT` line and returns
/// the process and `HOST:PORT`.
pub fn start(args: &[&str], envs: &[(&str, &str)]) -> (Running, String) {
    let (running, address, _) = start_with_http(args, envs);
    (running, address)
}

/// [`start`], also returning the address of the coordinator's HTTP API when it serves one
/// (the line `OpenAI-compatible HTTP API on http://HOST:PORT/v1` comes first).
pub fn start_with_http(args: &[&str], envs: &[(&str, &str)]) -> (Running, String, Option<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_specd"))
        .args(args)
        .envs(envs.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("specd starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut http = None;
    loop {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("a line");
        let line = line.trim();
        if let Some(url) = line.strip_prefix("OpenAI-compatible HTTP API on http://") {
            http = Some(url.trim_end_matches("/v1").to_owned());
            continue;
        }
        let address = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("{line:?}")).to_owned();
        return (Running(child), address, http);
    }
}
