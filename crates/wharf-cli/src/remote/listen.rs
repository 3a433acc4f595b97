//! `wharf listen URL`: prints a server's notifications as they come (list changes, resource
//! updates); when the stream ends it reconnects and reads the lists again, since changes
//! made meanwhile were not heard.

use std::collections::{BTreeSet, HashMap};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use serde_json::{Value, json};
use wharf_client::{Client, Connection};
use wharf_protocol::methods;

use super::{Endpoint, Stopped, until_stopped};

/// `wharf listen`.
#[derive(Debug, Args)]
pub(crate) struct ListenArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Tool list changes.
    #[arg(long)]
    tools: bool,
    /// Prompt list changes.
    #[arg(long)]
    prompts: bool,
    /// Resource list changes.
    #[arg(long)]
    resources: bool,
    /// Updates of this resource; repeatable.
    #[arg(long = "resource", value_name = "URI")]
    resource_uris: Vec<String>,
    /// Print each notification as one line of JSON.
    #[arg(long)]
    json: bool,
}

impl ListenArgs {
    /// The subscription filter; no choice at all means every list.
    fn filter(&self) -> Value {
        let all = !self.tools && !self.prompts && !self.resources && self.resource_uris.is_empty();
        let mut filter = json!({});
        for (on, key) in [
            (self.tools, "toolsListChanged"),
            (self.prompts, "promptsListChanged"),
            (self.resources, "resourcesListChanged"),
        ] {
            if on || all {
                filter[key] = json!(true);
            }
        }
        if !self.resource_uris.is_empty() {
            filter["resourceSubscriptions"] = json!(self.resource_uris);
        }
        filter
    }

    /// Whether `message` is one this listener asked for: a legacy session's stream carries
    /// every list change the server announces, whatever the filter said.
    fn wants(&self, message: &Value) -> bool {
        let key = match message["method"].as_str() {
            Some(methods::NOTIFICATION_TOOLS_LIST_CHANGED) => "toolsListChanged",
            Some("notifications/prompts/list_changed") => "promptsListChanged",
            Some("notifications/resources/list_changed") => "resourcesListChanged",
            _ => return true,
        };
        self.filter()[key] == true
    }
}

/// Longest wait between reconnections.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

pub(crate) fn run(args: ListenArgs) -> ExitCode {
    super::block_on(async move {
        // Ctrl-C or SIGTERM: heard by whatever runs then (a legacy session is ended on the
        // way out).
        let stopped = super::watch_stops();
        let mut backoff = Duration::from_millis(500);
        let mut known = Known::default();
        loop {
            match listen_once(&args, &mut known, stopped.clone()).await {
                Ok(()) => {
                    backoff = Duration::from_millis(500);
                    say(
                        &args,
                        format!("the stream ended; reconnecting in {}", secs(backoff)),
                    );
                }
                Err(Fatal(message)) => return super::failed(message),
                // Nobody reads what it would print: listening is over.
                Err(ReaderGone) => return ExitCode::SUCCESS,
                Err(Interrupted) => return say_stopped(&args, &stopped),
                Err(Transient(message)) => {
                    say(
                        &args,
                        format!("{message}; reconnecting in {}", secs(backoff)),
                    );
                }
            }
            let wait = stopped.clone();
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = until_stopped(wait) => return say_stopped(&args, &stopped),
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    })
}

/// Says the command was stopped, and how; its exit code.
fn say_stopped(args: &ListenArgs, stopped: &Stopped) -> ExitCode {
    let (signal, code) = super::stop_reason(stopped);
    say(args, format!("stopped ({signal})"));
    code
}

/// Why a stream stopped, when not by its end.
enum Stop {
    /// Worth trying again (connection lost, server restarting).
    Transient(String),
    /// Not worth it (the server refuses this subscription).
    Fatal(String),
    /// Stdout's reader has gone (`wharf listen | head -n 1`).
    ReaderGone,
    /// Ctrl-C or SIGTERM.
    Interrupted,
}
use Stop::{Fatal, Interrupted, ReaderGone, Transient};

/// Connects, subscribes and prints until the stream ends.
async fn listen_once(args: &ListenArgs, known: &mut Known, stopped: Stopped) -> Result<(), Stop> {
    let connected = tokio::select! {
        connected = args.endpoint.connect(json!({})) => connected,
        () = until_stopped(stopped.clone()) => return Err(Interrupted),
    };
    let client = connected.map_err(|e| {
        if e.retry {
            Transient(e.to_string())
        } else {
            Fatal(e.to_string())
        }
    })?;
    match client.connection() {
        // Interrupted, the stream is dropped (which closes it): its end is the server's.
        Connection::Modern(_) => tokio::select! {
            ended = listen_modern(args, &client, known) => ended,
            () = until_stopped(stopped.clone()) => Err(Interrupted),
        },
        Connection::Legacy(session) => {
            let listened = tokio::select! {
                ended = listen_legacy(args, &client, session, known) => ended,
                () = until_stopped(stopped) => Err(Interrupted),
            };
            // The next connection opens a session of its own: end this one, however the
            // listening ended (a server that does not answer holds it 3 s at most).
            super::close(&client).await;
            listened
        }
    }
}

/// Listens on a legacy session: its GET stream, and one `resources/subscribe` per resource.
async fn listen_legacy(
    args: &ListenArgs,
    client: &Client,
    session: &wharf_client::LegacySession,
    known: &mut Known,
) -> Result<(), Stop> {
    let (status, stream) = session
        .listen()
        .await
        .map_err(|e| Transient(e.to_string()))?;
    if status != 200 {
        return Err(Fatal(format!(
            "the server ({}) offers no notification stream: GET answered HTTP {status}",
            session.version()
        )));
    }
    for uri in &args.resource_uris {
        let reply = session
            .request("resources/subscribe", json!({ "uri": uri }))
            .await
            .map_err(|e| Transient(e.to_string()))?;
        if let Some(e) = reply.error() {
            return Err(Fatal(format!(
                "resources/subscribe {uri}: {}",
                e["message"]
            )));
        }
    }
    say(args, format!("listening ({} session)", session.version()));
    relist_all(args, client, known).await;
    let mut stream = Box::pin(stream);
    while let Some(message) = futures_util::StreamExt::next(&mut stream).await {
        if !args.wants(&message) {
            continue;
        }
        print_notification(args, client, known, &message).await;
        if super::stdout_gone() {
            return Err(ReaderGone);
        }
    }
    Ok(())
}

async fn listen_modern(args: &ListenArgs, client: &Client, known: &mut Known) -> Result<(), Stop> {
    let (id, mut incoming) = client
        .open(
            methods::SUBSCRIPTIONS_LISTEN,
            json!({ "notifications": args.filter() }),
        )
        .await
        .map_err(|e| Transient(e.to_string()))?;
    let mut acknowledged = false;
    while let Some(message) = incoming.next().await {
        let message = message.map_err(|e| Transient(format!("the stream broke: {e}")))?;
        // The listen's own answer carries its id; a refusal made before the request was
        // read (a 401 or 503 at the door) carries none, or null, and no method.
        let ours = match message.get("id") {
            None | Some(Value::Null) => message.get("method").is_none(),
            Some(got) => *got == id,
        };
        if ours {
            if let Some(error) = message.get("error") {
                let text = format!(
                    "subscriptions/listen refused: {} (error {}, HTTP {})",
                    error["message"].as_str().unwrap_or(""),
                    error["code"],
                    incoming.status
                );
                return Err(if incoming.status >= 500 {
                    Transient(text)
                } else {
                    Fatal(text)
                });
            }
            // The final result: the server ended the stream (draining, say).
            return Ok(());
        }
        if message["method"] == "notifications/subscriptions/acknowledged" {
            acknowledged = true;
            say(
                args,
                format!("listening for {}", message["params"]["notifications"]),
            );
            relist_all(args, client, known).await;
            continue;
        }
        print_notification(args, client, known, &message).await;
        if super::stdout_gone() {
            return Err(ReaderGone);
        }
    }
    if acknowledged {
        Ok(())
    } else {
        // Not a stream that served and ended: the wait before the next try grows.
        Err(Transient(
            "the stream ended before the server acknowledged the subscription".into(),
        ))
    }
}

/// Prints one notification; a list change is followed by the list as it is now.
async fn print_notification(
    args: &ListenArgs,
    client: &Client,
    known: &mut Known,
    message: &Value,
) {
    let method = message["method"].as_str().unwrap_or("?");
    if args.json {
        outln!("{message}");
    } else {
        let params = message
            .get("params")
            .filter(|p| {
                p.as_object()
                    .is_some_and(|o| o.keys().any(|k| k != "_meta"))
            })
            .map(|p| format!(" {p}"))
            .unwrap_or_default();
        outln!("{} {method}{params}", clock());
    }
    let list = match method {
        methods::NOTIFICATION_TOOLS_LIST_CHANGED => Some("tools"),
        "notifications/prompts/list_changed" => Some("prompts"),
        "notifications/resources/list_changed" => Some("resources"),
        _ => None,
    };
    if let Some(list) = list {
        client.forget_lists();
        relist(args, client, known, list).await;
    }
}

/// Once subscribed, the lists this listener follows, read again: a first count, or after a
/// reconnection what changed while nobody listened.
async fn relist_all(args: &ListenArgs, client: &Client, known: &mut Known) {
    let filter = args.filter();
    for (key, list) in [
        ("toolsListChanged", "tools"),
        ("promptsListChanged", "prompts"),
        ("resourcesListChanged", "resources"),
    ] {
        if filter[key] == true {
            relist(args, client, known, list).await;
        }
    }
}

/// The names each list had when last read.
type Known = HashMap<&'static str, BTreeSet<String>>;

/// Reads list `list` (`tools`, `prompts`, `resources`) and prints how many it holds and
/// what was added (`+`) and removed (`-`) since it was last read.
async fn relist(args: &ListenArgs, client: &Client, known: &mut Known, list: &'static str) {
    let method = match list {
        "tools" => methods::TOOLS_LIST,
        "prompts" => "prompts/list",
        _ => "resources/list",
    };
    match client.list(method, list).await {
        Ok(items) => {
            let names: BTreeSet<String> = items
                .iter()
                // Resources are told apart by URI; tools and prompts by name.
                .filter_map(|i| i["uri"].as_str().or(i["name"].as_str()))
                .map(str::to_owned)
                .collect();
            let change = match known.insert(list, names.clone()) {
                None => String::new(),
                Some(before) if before == names => " (no change)".to_owned(),
                Some(before) => {
                    let added = names.difference(&before).map(|n| format!("+{n}"));
                    let removed = before.difference(&names).map(|n| format!("-{n}"));
                    format!(" ({})", added.chain(removed).collect::<Vec<_>>().join(", "))
                }
            };
            say(args, format!("{list}: {}{change}", names.len()));
        }
        Err(e) => say(args, format!("{method}: {e}")),
    }
}

/// A status line: on standard output beside the notifications, or on standard error when
/// standard output carries JSON.
fn say(args: &ListenArgs, line: String) {
    if args.json {
        eprintln!("{} {line}", clock());
    } else {
        outln!("{} {}", clock(), console::style(line).dim());
    }
}

/// The time of day (UTC), `HH:MM:SS`.
fn clock() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        listen: ListenArgs,
    }

    fn listen(args: &[&str]) -> ListenArgs {
        let argv = ["wharf-listen", "http://127.0.0.1:1/mcp"]
            .iter()
            .chain(args);
        Command::try_parse_from(argv).unwrap().listen
    }

    /// A legacy session's stream carries every list change; only those asked for are
    /// printed (and read again), and other notifications always.
    #[test]
    fn only_the_list_changes_asked_for_are_taken() {
        let changed =
            |list: &str| json!({ "method": format!("notifications/{list}/list_changed") });
        let tools = listen(&["--tools"]);
        assert!(tools.wants(&changed("tools")));
        assert!(!tools.wants(&changed("prompts")));
        assert!(!tools.wants(&changed("resources")));
        assert!(tools.wants(&json!({ "method": "notifications/message" })));
        let every = listen(&[]);
        for list in ["tools", "prompts", "resources"] {
            assert!(every.wants(&changed(list)), "{list}");
        }
    }
}
