//! `specd bench --workload chat`: conversations that all open with one long system prompt,
//! each turn resending the conversation so far (its text, as a chat client does) plus a user
//! message.
//!
//! Four modes run every turn, in an order that rotates from turn to turn: speculative and
//! target-only, each with the nodes' prefix caches reused (one `cache_salt` per mode, so a
//! mode's conversations share the system prompt and their own earlier turns, never another
//! mode's) and not reused (every request its own salt, so nothing is found; the nodes still
//! file each ended session, and that cost is in these figures too). Each mode keeps its own
//! transcripts: a turn's prompt holds that mode's own earlier replies.

use std::time::Duration;

use serde_json::json;
use specd_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

use super::args::{BenchArgs, unique_salt};
use super::sample::{Sample, run_one};
use super::statistics::median;
use crate::cli_error::RpcFailure;
use crate::serve::GammaFlag;

/// One of the four ways a turn is run.
struct Mode {
    name: &'static str,
    /// γ of its requests (`Some(0)`: target-only; `None`: the coordinator's adaptive γ).
    gamma: Option<u32>,
    /// `Some(salt)`: every request of the mode carries it; `None`: each its own.
    salt: Option<String>,
    /// Each conversation's text so far.
    transcripts: Vec<String>,
    turns: Vec<Turn>,
}

/// One measured turn.
struct Turn {
    turn: usize,
    sample: Sample,
}

/// Runs the chat workload against `client` and returns its report.
pub(super) async fn measure(
    args: &BenchArgs,
    client: &mut GenerationClient<Channel>,
    endpoint: &str,
    prompts: &[String],
) -> anyhow::Result<serde_json::Value> {
    let spec_gamma = match args.gamma {
        GammaFlag::Fixed(g) => Some(g),
        GammaFlag::Auto => None,
    };
    let system = system_prompt(args, client, prompts).await?;
    let nonce = unique_salt();
    let mut modes: Vec<Mode> = [
        ("speculative, cache reused", spec_gamma, true),
        ("speculative, no reuse", spec_gamma, false),
        ("target-only, cache reused", Some(0), true),
        ("target-only, no reuse", Some(0), false),
    ]
    .into_iter()
    .map(|(name, gamma, reuse)| Mode {
        name,
        gamma,
        salt: reuse.then(|| format!("{nonce}-{name}")),
        transcripts: vec![system.text.clone(); args.conversations],
        turns: Vec::new(),
    })
    .collect();
    for turn in 0..args.turns {
        for conversation in 0..args.conversations {
            let user = &prompts[(conversation * args.turns + turn) % prompts.len()];
            let seed = args.seed.wrapping_add((conversation * args.turns + turn) as u64);
            let count = modes.len();
            let first = (conversation + turn) % count;
            for m in (0..count).map(|i| (first + i) % count) {
                let mode = &mut modes[m];
                let transcript = &mut mode.transcripts[conversation];
                transcript.push_str(user);
                transcript.push('\n');
                let salt = mode.salt.clone().unwrap_or_else(unique_salt);
                let request = args.request_with(transcript, mode.gamma, seed, salt, args.max_new_tokens);
                let sample = run_one(client, request).await.map_err(|e| too_long(e, args))?;
                transcript.push_str(&sample.text);
                transcript.push_str("\n\n");
                mode.turns.push(Turn { turn, sample });
            }
        }
        if !args.json {
            eprintln!("turn {}/{} of {} conversations done", turn + 1, args.turns, args.conversations);
        }
    }
    Ok(report(args, endpoint, &system, &modes))
}

/// The shared system prompt: whole copies of the prompt set, enough for `--system-tokens`.
struct SystemPrompt {
    text: String,
    tokens: u64,
}

/// Builds the system prompt, counting tokens with the coordinator's tokenizer (one short
/// request on one copy, one on the whole).
async fn system_prompt(
    args: &BenchArgs,
    client: &mut GenerationClient<Channel>,
    prompts: &[String],
) -> anyhow::Result<SystemPrompt> {
    let copy = format!("{}\n\n", prompts.join("\n\n"));
    let count = |text: String, client: &mut GenerationClient<Channel>| {
        let request = args.request_with(&text, Some(0), args.seed, unique_salt(), 1);
        let mut client = client.clone();
        async move { run_one(&mut client, request).await.map(|s| s.prompt_tokens) }
    };
    let per_copy = count(copy.clone(), client).await?.max(1);
    let copies = u64::from(args.system_tokens).div_ceil(per_copy).max(1) as usize;
    let text = copy.repeat(copies);
    let tokens = count(text.clone(), client).await.map_err(|e| too_long(e, args))?;
    Ok(SystemPrompt { text, tokens })
}

/// A request refused as invalid (a prompt past the model's context, as the turns grow), with
/// what to change said in the workload's terms; other errors as they came.
fn too_long(err: anyhow::Error, args: &BenchArgs) -> anyhow::Error {
    let refused = err.downcast_ref::<RpcFailure>().is_some_and(|f| f.0.code() == tonic::Code::InvalidArgument);
    if !refused {
        return err;
    }
    let message = format!(
        "{err}. The chat workload's prompts grow with every turn: lower --system-tokens ({}), --turns ({}) or \
         --max-new-tokens ({}) to fit the model's context",
        args.system_tokens, args.turns, args.max_new_tokens
    );
    err.context(message)
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// What one mode measured.
fn mode_report(mode: &Mode, turns: usize) -> serde_json::Value {
    let ttft_ms = |t: &Turn| seconds(t.sample.first_round.as_ref().map_or(t.sample.wall, |f| f.wall)) * 1e3;
    let by_turn: Vec<f64> = (0..turns)
        .map(|turn| median(&mode.turns.iter().filter(|t| t.turn == turn).map(ttft_ms).collect::<Vec<_>>()))
        .collect();
    let later: Vec<&Turn> = mode.turns.iter().filter(|t| t.turn > 0).collect();
    let later_ttft: Vec<f64> = later.iter().map(|t| ttft_ms(t)).collect();
    let total: f64 = mode.turns.iter().map(|t| seconds(t.sample.wall)).sum();
    let tokens: u64 = mode.turns.iter().map(|t| t.sample.tokens).sum();
    // Over the turns that ran on a node: under an adaptive γ the coordinator may decode a
    // request target-only, and then no draft session opens.
    let reused = |turns: &[&Turn], cached: fn(&Turn) -> u64| {
        let prompt_tokens: u64 = turns.iter().map(|t| t.sample.prompt_tokens).sum();
        (prompt_tokens > 0).then(|| turns.iter().map(|t| cached(t)).sum::<u64>() as f64 / prompt_tokens as f64)
    };
    let prompt_tokens: u64 = later.iter().map(|t| t.sample.prompt_tokens).sum();
    let drafted: Vec<&Turn> = later.iter().copied().filter(|t| t.sample.stats.draft_forward_passes > 0).collect();
    json!({
        "ttft_ms_median_by_turn": by_turn,
        "ttft_ms_median_after_first_turn": (!later_ttft.is_empty()).then(|| median(&later_ttft)),
        "total_s": total,
        "tokens": tokens,
        "tokens_per_s": tokens as f64 / total.max(f64::MIN_POSITIVE),
        "prompt_tokens_after_first_turn": prompt_tokens,
        "target_reused_after_first_turn": reused(&later, |t| u64::from(t.sample.stats.target_cached_tokens)),
        "turns_after_first_with_a_draft_session": drafted.len(),
        "draft_reused_after_first_turn": reused(&drafted, |t| u64::from(t.sample.stats.draft_cached_tokens)),
    })
}

/// The report: each mode, and the ratios the cache is judged by.
fn report(args: &BenchArgs, endpoint: &str, system: &SystemPrompt, modes: &[Mode]) -> serde_json::Value {
    let by_name: serde_json::Map<String, serde_json::Value> =
        modes.iter().map(|m| (m.name.to_owned(), mode_report(m, args.turns))).collect();
    let field = |name: &str, key: &str| by_name[name][key].as_f64();
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    let cache_effect = |prefix: &str| {
        let (on, off) = (format!("{prefix}, cache reused"), format!("{prefix}, no reuse"));
        json!({
            "ttft_after_first_turn_cache_over_no_reuse": ratio(
                field(&on, "ttft_ms_median_after_first_turn"),
                field(&off, "ttft_ms_median_after_first_turn"),
            ),
            "total_time_speedup_with_cache": ratio(field(&off, "total_s"), field(&on, "total_s")),
        })
    };
    json!({
        "workload": "chat",
        "endpoint": endpoint,
        "conversations": args.conversations,
        "turns": args.turns,
        "system_prompt_tokens": system.tokens,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "gamma": match args.gamma {
            GammaFlag::Auto => "auto".to_owned(),
            GammaFlag::Fixed(g) => g.to_string(),
        },
        "dtype": args.dtype_label(),
        "proposer": args.proposer_name(),
        "modes": by_name,
        "speculative": cache_effect("speculative"),
        "target_only": cache_effect("target-only"),
        "speculative_speedup_with_cache": ratio(
            field("target-only, cache reused", "total_s"),
            field("speculative, cache reused", "total_s"),
        ),
        "conversations_as_target_only_without_reuse": same_conversations(modes, REFERENCE_MODE),
    })
}

/// The mode the others' transcripts are compared with: the target alone, every prompt
/// prefilled whole.
const REFERENCE_MODE: &str = "target-only, no reuse";

/// For each mode, how many of its conversations read exactly as `reference`'s. Greedy
/// (T = 0), all of them in every mode: the cache changes no output, and neither does
/// speculation. Seeded at T > 0, the target-only modes still agree with each other (their
/// draws are keyed alike), up to a draw within rounding of an edge.
fn same_conversations(modes: &[Mode], reference: &str) -> serde_json::Value {
    let Some(reference) = modes.iter().find(|m| m.name == reference) else { return serde_json::Value::Null };
    let counts: serde_json::Map<String, serde_json::Value> = modes
        .iter()
        .map(|m| {
            let same = m.transcripts.iter().zip(&reference.transcripts).filter(|(a, b)| a == b).count();
            (m.name.to_owned(), json!(same))
        })
        .collect();
    serde_json::Value::Object(counts)
}

/// The report as a table, for a terminal.
pub(super) fn print_table(report: &serde_json::Value) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "chat: {} conversations × {} turns, system prompt {} tokens, {} new tokens a turn, T = {}, γ {}",
        report["conversations"],
        report["turns"],
        report["system_prompt_tokens"],
        report["max_new_tokens"],
        report["temperature"],
        report["gamma"].as_str().unwrap_or("?"),
    )?;
    writeln!(
        out,
        "{:<28} {:>14} {:>9} {:>9} {:>14} {:>13}",
        "mode", "TTFT ms (≥2)", "total s", "tok/s", "target reused", "draft reused"
    )?;
    let pct = |v: &serde_json::Value| v.as_f64().map_or("-".to_owned(), |f| format!("{:.1} %", 100.0 * f));
    if let Some(modes) = report["modes"].as_object() {
        for (name, m) in modes {
            writeln!(
                out,
                "{:<28} {:>14.1} {:>9.2} {:>9.1} {:>14} {:>22}",
                name,
                m["ttft_ms_median_after_first_turn"].as_f64().unwrap_or(f64::NAN),
                m["total_s"].as_f64().unwrap_or(f64::NAN),
                m["tokens_per_s"].as_f64().unwrap_or(f64::NAN),
                pct(&m["target_reused_after_first_turn"]),
                match m["turns_after_first_with_a_draft_session"].as_u64() {
                    Some(n) if n > 0 => format!("{} ({n} turns)", pct(&m["draft_reused_after_first_turn"])),
                    _ => "-".to_owned(),
                },
            )?;
        }
    }
    for mode in ["speculative", "target_only"] {
        let r = &report[mode];
        writeln!(
            out,
            "{mode}: TTFT after the first turn ×{:.2} with the cache; total time {:.2}× faster",
            r["ttft_after_first_turn_cache_over_no_reuse"].as_f64().unwrap_or(f64::NAN),
            r["total_time_speedup_with_cache"].as_f64().unwrap_or(f64::NAN),
        )?;
    }
    writeln!(
        out,
        "speculative against target-only, both with the cache: {:.2}×",
        report["speculative_speedup_with_cache"].as_f64().unwrap_or(f64::NAN)
    )?;
    if let Some(same) = report["conversations_as_target_only_without_reuse"].as_object() {
        let counts: Vec<String> = same.iter().map(|(mode, n)| format!("{mode} {n}")).collect();
        writeln!(
            out,
            "conversations that read as target-only without reuse (of {}): {}",
            report["conversations"],
            counts.join(", ")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(name: &'static str, transcripts: &[&str]) -> Mode {
        let transcripts = transcripts.iter().map(|t| (*t).to_owned()).collect();
        Mode { name, gamma: None, salt: None, transcripts, turns: Vec::new() }
    }

    #[test]
    fn each_mode_s_conversations_are_compared_with_the_reference_s_one_by_one() {
        let modes = [
            mode("speculative, cache reused", &["a b", "c d", "e f"]),
            mode(REFERENCE_MODE, &["a b", "c x", "e f"]),
            mode("target-only, cache reused", &["a b", "c x", "f e"]),
        ];
        let same = same_conversations(&modes, REFERENCE_MODE);
        assert_eq!(same["speculative, cache reused"], 2);
        assert_eq!(same[REFERENCE_MODE], 3);
        assert_eq!(same["target-only, cache reused"], 2);
        assert!(same_conversations(&modes, "no such mode").is_null());
    }
}
