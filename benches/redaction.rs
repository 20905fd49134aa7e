//! What redaction costs on the call path: `Agent::call_tool` on an echo tool returning 1 KiB and
//! 64 KiB, through an agent that holds secrets (one the server was given from a Secret, plus the
//! agent's own keys: their spellings are searched in every output) and through the same agent
//! holding none, in the same run. Calls alternate one by one between the two agents so drift hits
//! both alike. A third row: the output holds the value, so it is actually replaced. The output
//! is words, numbers and base64-looking runs (`filler`), as a real server's would be.
//!
//! Run: `cargo bench --bench redaction`. The echo server is this binary itself, re-run with
//! `--serve-echo`. Target: on/off p50 within 5% at 1 KiB.
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use spear::agent::audit::Door;
use spear::agent::{Agent, AgentOptions, CallContext};
use spear::api::manifest::Object;
use spear::api::{McpProfile, McpServer};
use spear::testing::bench::{main_serving_echo, percentile, static_agent, us};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "ghp_K7v2LxQ9mZ4tR8wY1nB6cD3fH5jS0aP";

/// An agent over this binary's echo server; with `secret`, the server is given `TOKEN` from a
/// Secret (`valueFrom`), which the agent then holds.
async fn agent(exe: &Path, secret: bool) -> (Agent, CancellationToken) {
    let mut server = McpServer::test("echo").stdio(&exe.display().to_string(), ["--serve-echo"]).allowing(["*"]);
    if secret {
        server = server.secret_env("API_TOKEN", "gh", "token");
    }
    let objects = vec![Object::Server(server), Object::Profile(McpProfile::test("p").servers(["echo"]))];
    let env = move |name: &str| match name {
        "SPEAR_SECRET_ECHO_API_TOKEN" if secret => Some(TOKEN.to_string()),
        _ => std::env::var(name).ok(),
    };
    static_agent(objects, Arc::new(env), AgentOptions::new("p")).await
}

/// `size` bytes of text a server might return: words, numbers and base64-looking runs from a
/// fixed pseudo-random sequence (a run of one byte would let the automaton's prefilter skip it).
fn filler(size: usize) -> String {
    const WORDS: &[&str] = &["the", "server", "returned", "rows", "id", "token", "config", "path", "value", "error"];
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut text = String::with_capacity(size + 64);
    while text.len() < size {
        match next() % 4 {
            0 => text.push_str(&(next() % 100_000).to_string()),
            1 => (0..24).for_each(|_| text.push(B64[(next() % 64) as usize] as char)),
            _ => text.push_str(WORDS[(next() % WORDS.len() as u64) as usize]),
        }
        text.push(' ');
    }
    text.truncate(size);
    text
}

async fn call(agent: &Agent, text: &str) -> Duration {
    let set = agent.effective(None, &[]).expect("the set");
    let arguments = json!({"text": text}).as_object().cloned();
    let started = Instant::now();
    let call =
        agent.call_tool(&set, "mcp__echo__echo", Ok(arguments), CallContext::new(Door::Mcp, "bench", None)).await;
    let latency = started.elapsed();
    assert_eq!(call.status(), "ok", "{}", call.model_text().chars().take(200).collect::<String>());
    latency
}

async fn run(full: bool) {
    let rounds = if full { 2000 } else { 3 };
    let exe = std::env::current_exe().expect("the bench binary's path");
    let (on, stop_on) = agent(&exe, true).await;
    let (off, stop_off) = agent(&exe, false).await;
    // The held agent redacts what it was given (the check that this is the path measured).
    let check = on.effective(None, &[]).expect("set");
    let echoed = on
        .call_tool(
            &check,
            "mcp__echo__echo",
            Ok(json!({"text": "x"}).as_object().cloned()),
            CallContext::new(Door::Mcp, "c", None),
        )
        .await;
    assert_eq!(echoed.model_text(), "x");

    println!("| output | on p50 | off p50 | on/off p50 | on p99 | off p99 |");
    println!("|---|---|---|---|---|---|");
    for (label, size, holds) in
        [("1 KiB", 1024usize, false), ("64 KiB", 65_536, false), ("1 KiB holding the value", 1024, true)]
    {
        let mut text = filler(size);
        if holds {
            text.replace_range(100..100 + TOKEN.len(), TOKEN);
        }
        for _ in 0..50 {
            call(&on, &text).await;
            call(&off, &text).await;
        }
        let (mut a, mut b) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        for _ in 0..rounds {
            a.push(call(&on, &text).await);
            b.push(call(&off, &text).await);
        }
        a.sort();
        b.sort();
        let (a50, b50) = (percentile(&a, 0.5), percentile(&b, 0.5));
        println!(
            "| {label} | {:.1} µs | {:.1} µs | **{:.3}** | {:.1} µs | {:.1} µs |",
            us(a50),
            us(b50),
            us(a50) / us(b50),
            us(percentile(&a, 0.99)),
            us(percentile(&b, 0.99))
        );
    }
    stop_on.cancel();
    stop_off.cancel();
}

fn main() {
    main_serving_echo(run);
}
