//! `wharf call URL TOOL key=value…`: calls a tool with a progress bar, answers the server's
//! questions in the terminal (or from `--answer`), and cancels on Ctrl-C.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{Value, json};
use wharf_client::{
    Answerer, CallError, Client, Event, IDEMPOTENCY_KEY, Prepared, ToolCall, Unanswered,
    new_idempotency_key,
};
use wharf_protocol::InputRequest;

use super::{Endpoint, arguments, prompt};

/// `wharf call`.
#[derive(Debug, Args)]
pub(crate) struct CallArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// The tool to call.
    tool: String,
    /// Arguments as key=value, typed by the tool's input schema (a,b,c for arrays, JSON for
    /// objects).
    #[arg(value_name = "KEY=VALUE")]
    words: Vec<String>,
    /// The arguments as a JSON object (key=value words override its keys), or @FILE
    /// holding it, or - to read it from standard input: arguments on the command line are
    /// visible to other users (`ps`) and kept in shell history.
    #[arg(long, value_name = "JSON")]
    json: Option<String>,
    /// An answer to the server's input request KEY, as the JSON result of its method (e.g.
    /// '{"action":"accept","content":{"name":"Ada"}}'), or @FILE holding it; repeatable.
    #[arg(long = "answer", value_name = "KEY=JSON")]
    answers: Vec<String>,
    /// A root this client exposes, answered when the server asks for roots; repeatable.
    #[arg(long = "root", value_name = "URI")]
    roots: Vec<String>,
    /// The text to answer a sampling request with (instead of typing it), or @FILE.
    #[arg(long, value_name = "TEXT")]
    sampling_reply: Option<String>,
    /// The idempotency key of a write (generated and printed when the tool requires one).
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Never prompt: input requests without an --answer fail the call.
    #[arg(long)]
    no_input: bool,
    /// How to print the result.
    #[arg(long, value_enum, default_value_t = Output::Pretty)]
    output: Output,
}

/// How the result is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Structured content as indented JSON, else the content items as text.
    Pretty,
    /// The whole `CallToolResult` as JSON.
    Json,
}

pub(crate) fn run(args: CallArgs) -> ExitCode {
    super::block_on(async move {
        // Read before anything is opened on the server (a missing file ends the command
        // first), and before Ctrl-C and SIGTERM are taken over: stopped while it reads,
        // the command ends as it always did.
        let json = match read_json(args.json.as_deref()) {
            Ok(json) => json,
            Err(e) => return super::failed(e),
        };
        // From here: a stop while connecting ends the command as one during the call.
        let stopped = super::watch_stops();
        let interactive = !args.no_input && prompt::is_interactive();
        let connect = args.endpoint.connect(capabilities(&args, interactive));
        let client = tokio::select! {
            connected = connect => match connected {
                Ok(c) => c,
                Err(e) => return super::failed(e),
            },
            () = super::until_stopped(stopped.clone()) => {
                let (signal, code) = super::stop_reason(&stopped);
                eprintln!("stopped ({signal}) before the call was sent");
                return code;
            }
        };
        let code = call(&client, &args, json.as_deref(), interactive, stopped).await;
        super::close(&client).await;
        code
    })
}

/// The `--json` arguments: as given, from file PATH for `@PATH`, from standard input for
/// `-`.
fn read_json(json: Option<&str>) -> Result<Option<String>, String> {
    match json {
        Some("-") => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .map_err(|e| format!("--json -: cannot read standard input: {e}"))?;
            Ok(Some(text))
        }
        Some(json) => text_or_file(json)
            .map(Some)
            .map_err(|e| format!("--json: {e}")),
        None => Ok(None),
    }
}

/// Calls the tool over `client`, connected: what `run` does once the server answered.
async fn call(
    client: &Client,
    args: &CallArgs,
    json: Option<&str>,
    interactive: bool,
    stopped: super::Stopped,
) -> ExitCode {
    let prepared = tokio::select! {
        prepared = prepare(client, args, json) => prepared,
        () = super::until_stopped(stopped.clone()) => {
            let (signal, code) = super::stop_reason(&stopped);
            eprintln!("stopped ({signal}) before the call was sent");
            return code;
        }
    };
    let call = match prepared {
        Ok(call) => call,
        Err(e) => return super::failed(e),
    };
    let answers = match prepared_answers(&args.answers) {
        Ok(a) => a,
        Err(e) => return super::failed(e),
    };
    let sampling_reply = match args.sampling_reply.as_deref().map(text_or_file).transpose() {
        Ok(reply) => reply,
        Err(e) => return super::failed(format!("--sampling-reply {e}")),
    };
    let bar = progress_bar(&args.tool);
    let mut answerer = Prepared::new(
        answers,
        Terminal {
            bar: bar.clone(),
            roots: args.roots.clone(),
            sampling_reply,
            interactive,
        },
    );
    let last_id = Arc::new(Mutex::new(Value::Null));
    let mut on_event = {
        let bar = bar.clone();
        let last_id = last_id.clone();
        move |event: Event| show_event(&bar, &last_id, event)
    };
    let outcome = tokio::select! {
        outcome = client.call_tool(&call, &mut answerer, &mut on_event) => outcome,
        () = super::until_stopped(stopped.clone()) => {
            let (signal, code) = super::stop_reason(&stopped);
            bar.finish_and_clear();
            let id = last_id.lock().map(|id| id.clone()).unwrap_or(Value::Null);
            // The call's future is dropped here, which closes its stream: that is the
            // cancellation a 2026-07-28 server acts on. A legacy one is told.
            // Bounded: a server that does not answer the cancellation does not hold the
            // terminal (a second Ctrl-C would not reach this process).
            let reason = format!("cancelled by the user ({signal})");
            let cancel = client.cancel(&id, &reason);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(3), cancel).await;
            eprintln!("cancelled ({signal}): the call's stream is closed and the server stops the call");
            return code;
        }
    };
    bar.finish_and_clear();
    match outcome {
        Ok(result) => show_result(&result, args.output),
        Err(e) => show_error(&e, call.key(), &args.endpoint),
    }
}

/// What this client can answer: elicitation, roots and sampling when someone at the
/// terminal can, or when flags give the answers; nothing otherwise, so that a server that
/// needs input says so up front (-32021) rather than asking in vain.
fn capabilities(args: &CallArgs, interactive: bool) -> Value {
    let prepared = !args.answers.is_empty();
    let mut capabilities = json!({});
    if interactive || prepared {
        capabilities["elicitation"] = json!({ "form": {}, "url": {} });
    }
    if interactive || prepared || !args.roots.is_empty() {
        capabilities["roots"] = json!({});
    }
    if interactive || prepared || args.sampling_reply.is_some() {
        capabilities["sampling"] = json!({});
    }
    capabilities
}

/// The call to make: the tool's schema types the arguments; a write gets its key.
async fn prepare(client: &Client, args: &CallArgs, json: Option<&str>) -> Result<ToolCall, String> {
    let tools = client
        .list_tools()
        .await
        .map_err(|e| format!("tools/list: {e}"))?;
    let Some(tool) = tools.iter().find(|t| t["name"] == args.tool.as_str()) else {
        let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
        return Err(format!(
            "the server has no tool {:?}; it has: {}",
            args.tool,
            names.join(", ")
        ));
    };
    let schema = &tool["inputSchema"];
    let arguments = arguments::parse(schema, json, &args.words)?;
    let mut call = ToolCall::for_tool(tool, Value::Object(arguments)).with_progress();
    let needs_key = schema["required"]
        .as_array()
        .is_some_and(|r| r.iter().any(|k| k == IDEMPOTENCY_KEY));
    let given = call
        .key()
        .map(str::to_owned)
        .or(args.idempotency_key.clone());
    let takes_key = schema["properties"].get(IDEMPOTENCY_KEY).is_some();
    match given {
        Some(_) if !takes_key => {
            return Err(format!(
                "not sent: tool {:?} takes no {IDEMPOTENCY_KEY}, so a key would not make a retry safe; call it again without --idempotency-key",
                args.tool
            ));
        }
        Some(key) => call = call.idempotency_key(key),
        None if needs_key => {
            let key = new_idempotency_key();
            eprintln!(
                "idempotency key: {key} (to retry this write without applying it twice: --idempotency-key {key})"
            );
            call = call.idempotency_key(key);
        }
        None => {}
    }
    Ok(call)
}

/// `--answer KEY=JSON` words as a map.
fn prepared_answers(words: &[String]) -> Result<BTreeMap<String, Value>, String> {
    words
        .iter()
        .map(|word| {
            let (key, raw) = word
                .split_once('=')
                .ok_or_else(|| format!("--answer {word:?} is not KEY=JSON or KEY=@FILE"))?;
            let raw = text_or_file(raw).map_err(|e| format!("--answer {key}: {e}"))?;
            let value = serde_json::from_str(&raw)
                .map_err(|e| format!("--answer {key}: the answer is not JSON ({e})"))?;
            Ok((key.to_owned(), value))
        })
        .collect()
}

/// `value` itself, or the contents of file PATH when it is `@PATH`.
fn text_or_file(value: &str) -> Result<String, String> {
    match value.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}")),
        None => Ok(value.to_owned()),
    }
}

/// A spinner until the first progress, then a bar (drawn only on a terminal).
fn progress_bar(tool: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(format!("calling {tool}"));
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

fn show_event(bar: &ProgressBar, last_id: &Mutex<Value>, event: Event) {
    match event {
        Event::Sent { id } => {
            if let Ok(mut last) = last_id.lock() {
                *last = id;
            }
        }
        Event::Progress {
            progress,
            total,
            message,
        } => {
            if let Some(total) = total
                && bar.length() != Some(total as u64)
            {
                bar.set_length(total as u64);
                bar.set_style(
                    ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar()),
                );
            }
            bar.set_position(progress as u64);
            if let Some(message) = message {
                bar.set_message(message);
            }
        }
        Event::Notification(n) if n["method"] == "notifications/message" => {
            let p = &n["params"];
            let data = match &p["data"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            above(
                bar,
                format!(
                    "{} {}{data}",
                    console::style(format!("[{}]", p["level"].as_str().unwrap_or("log")))
                        .for_stderr()
                        .dim(),
                    p["logger"]
                        .as_str()
                        .map(|l| format!("{l}: "))
                        .unwrap_or_default()
                ),
            );
        }
        Event::Retrying {
            attempt,
            error,
            after,
            ..
        } => {
            above(
                bar,
                format!(
                    "retrying (attempt {attempt}) in {:.1} s after: {error}",
                    after.as_secs_f64()
                ),
            );
        }
        _ => {}
    }
}

/// Prints `line` on stderr above the progress bar; straight to stderr when the bar is
/// hidden (stderr not a terminal), where indicatif would drop it.
fn above(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Prints a result: structured content as JSON, else each content item.
fn show_result(result: &Value, output: Output) -> ExitCode {
    let failed = result["isError"] == true;
    if output == Output::Json {
        outln!("{result:#}");
    } else if let (Some(structured), false) = (result.get("structuredContent"), failed) {
        outln!("{structured:#}");
    } else {
        for item in result["content"].as_array().into_iter().flatten() {
            let line = match item["type"].as_str() {
                Some("text") => item["text"].as_str().unwrap_or("").to_owned(),
                Some(kind @ ("image" | "audio")) => format!(
                    "[{kind} {}, {} bytes of base64]",
                    item["mimeType"].as_str().unwrap_or("?"),
                    item["data"].as_str().map_or(0, str::len)
                ),
                Some("resource_link") => format!("→ {}", item["uri"].as_str().unwrap_or("?")),
                Some("resource") => {
                    let r = &item["resource"];
                    match r["text"].as_str() {
                        Some(text) => format!("{}:\n{text}", r["uri"].as_str().unwrap_or("?")),
                        None => format!("[resource {}]", r["uri"].as_str().unwrap_or("?")),
                    }
                }
                _ => item.to_string(),
            };
            if failed {
                eprintln!("{line}");
            } else {
                outln!("{line}");
            }
        }
    }
    if failed {
        super::failed("the tool reported an error (isError)")
    } else {
        ExitCode::SUCCESS
    }
}

fn show_error(error: &CallError, key: Option<&str>, endpoint: &Endpoint) -> ExitCode {
    if let CallError::Rpc {
        data: Some(data), ..
    } = error
    {
        eprintln!("{data:#}");
    }
    // A token without a scope the call needs (403 `insufficient_scope`, with the scopes of
    // what the call reaches; those the server needs of every request are not among them):
    // say how to get one that has them.
    if let CallError::Rpc {
        status: 403,
        data: Some(data),
        ..
    } = error
    {
        let needed: Vec<&str> = data["requiredScopes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if !needed.is_empty() {
            let needed = needed.join(" ");
            match &endpoint.token {
                Some(_) => eprintln!(
                    "the token given (--token or WHARF_TOKEN) lacks a scope this call needs ({needed}): use one granted it"
                ),
                None => eprintln!(
                    "the token lacks a scope this call needs ({needed}): sign in again with `wharf login '{}'`, which asks for every scope the server offers (or for those --scope names: the new token replaces the old)",
                    endpoint.url
                ),
            }
        }
    }
    // Without a terminal this client declares no input capability (see `capabilities`),
    // so a tool that asks for input is refused up front: say which flag answers it.
    if let CallError::Rpc { code: -32021, .. } = error {
        eprintln!(
            "the tool asks for input, which nobody can give here (no terminal, or --no-input): give it with --answer KEY=JSON (an elicitation; KEY is the input request's name), --root URI (roots) or --sampling-reply TEXT (sampling)"
        );
    }
    if let Some(after) = error.retry_after() {
        eprintln!(
            "the server asks to be sent this again in {} s",
            after.as_secs()
        );
    }
    if let (CallError::Transport(_), Some(key)) = (error, key) {
        eprintln!(
            "the write may or may not have been applied: retry with --idempotency-key {key} and the same arguments"
        );
    }
    super::failed(error)
}

/// Answers input requests from flags, else by asking the person at the terminal.
struct Terminal {
    bar: ProgressBar,
    roots: Vec<String>,
    sampling_reply: Option<String>,
    interactive: bool,
}

impl Answerer for Terminal {
    async fn answer(&mut self, key: &str, request: &InputRequest) -> Result<Value, Unanswered> {
        match request {
            InputRequest::ListRoots(_) if !self.roots.is_empty() => Ok(json!({
                "roots": self.roots.iter().map(|uri| json!({ "uri": uri })).collect::<Vec<_>>(),
            })),
            InputRequest::CreateMessage(_) if self.sampling_reply.is_some() => Ok(prompt::sampled(
                self.sampling_reply.as_deref().unwrap_or(""),
            )),
            _ if !self.interactive => Err(Unanswered::new(
                key,
                request,
                format!("no terminal to ask in; pass --answer {key}=JSON"),
            )),
            _ => {
                let bar = self.bar.clone();
                let (key, request) = (key.to_owned(), request.clone());
                // The prompts block on the terminal; the progress bar stays out of their way.
                let (asked_key, asked) = (key.clone(), request.clone());
                tokio::task::spawn_blocking(move || bar.suspend(|| prompt::ask(&key, &request)))
                    .await
                    .unwrap_or_else(|e| {
                        Err(Unanswered::new(
                            &asked_key,
                            &asked,
                            format!("the prompt failed: {e}"),
                        ))
                    })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_come_inline_or_from_files_and_bad_ones_are_named() {
        let file = std::env::temp_dir().join(format!("wharf-answer-{}.json", std::process::id()));
        std::fs::write(&file, r#"{"action":"decline"}"#).unwrap();
        let answers = prepared_answers(&[
            r#"a={"action":"cancel"}"#.to_owned(),
            format!("b=@{}", file.display()),
        ])
        .unwrap();
        assert_eq!(answers["a"], json!({ "action": "cancel" }));
        assert_eq!(answers["b"], json!({ "action": "decline" }));
        std::fs::remove_file(&file).unwrap();
        let missing = prepared_answers(&[format!("b=@{}", file.display())]).unwrap_err();
        assert!(
            missing.starts_with("--answer b: ") && missing.contains("No such file"),
            "{missing}"
        );
        assert_eq!(
            prepared_answers(&["c={".to_owned()]).unwrap_err(),
            "--answer c: the answer is not JSON (EOF while parsing an object at line 1 column 1)"
        );
        assert!(
            prepared_answers(&["nokey".to_owned()])
                .unwrap_err()
                .contains("KEY=JSON")
        );
    }
}
