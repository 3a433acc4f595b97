//! A client of any MCP server (2026-07-28, or an earlier revision through `initialize`):
//! lists the tools, then calls one, showing its progress and approving every form the
//! server asks to be filled in. Pair it with the `confirm` example:
//!
//! ```text
//! cargo run -p wharf-examples --example confirm &
//! cargo run -p wharf-examples --example client -- http://127.0.0.1:8080/mcp delete_file '{"path":"/tmp/x"}'
//! ```

use serde_json::{Map, Value, json};
use wharf_client::protocol::{ElicitParams, InputRequest};
use wharf_client::{Answerer, Client, Event, HttpClient, ToolCall, Unanswered};

/// Approves: accepts every form, each yes/no field answered yes. Anything else (sampling,
/// roots, a URL to visit) is left unanswered, which ends the call with an error naming it.
struct Approve;

impl Answerer for Approve {
    async fn answer(&mut self, key: &str, request: &InputRequest) -> Result<Value, Unanswered> {
        let InputRequest::Elicit(ElicitParams::Form(form)) = request else {
            return Err(Unanswered::new(
                key,
                request,
                "this client only approves forms",
            ));
        };
        println!("approving: {}", form.message);
        let mut content = Map::new();
        for (name, field) in form.requested_schema["properties"]
            .as_object()
            .into_iter()
            .flatten()
        {
            if field["type"] == "boolean" {
                content.insert(name.clone(), json!(true));
            }
        }
        Ok(json!({ "action": "accept", "content": content }))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(tool)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: client URL TOOL [ARGUMENTS-AS-JSON]");
    };
    let arguments: Value = match args.next() {
        Some(json) => serde_json::from_str(&json)?,
        None => json!({}),
    };
    let mut http = HttpClient::new(url);
    // Declare what this client answers; a server then asks only for that.
    http.meta.capabilities = json!({ "elicitation": { "form": {} } });
    let client = Client::connect(http).await?;
    println!("speaking {}", client.version());
    for listed in client.list_tools().await? {
        println!("tool {}", listed["name"].as_str().unwrap_or("?"));
    }
    let call = ToolCall::new(tool, arguments).with_progress();
    let mut on_event = |event: Event| {
        if let Event::Progress {
            progress, total, ..
        } = event
        {
            println!("progress {progress} of {}", total.unwrap_or(f64::NAN));
        }
    };
    let result = client.call_tool(&call, &mut Approve, &mut on_event).await?;
    for item in result["content"].as_array().into_iter().flatten() {
        println!("{}", item["text"].as_str().unwrap_or_default());
    }
    Ok(())
}
