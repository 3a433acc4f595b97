//! `wharf tools URL`: the server's tools, their arguments and descriptions.

use std::process::ExitCode;

use clap::Args;

use super::{Endpoint, arguments};

/// `wharf tools`.
#[derive(Debug, Args)]
pub(crate) struct ToolsArgs {
    #[command(flatten)]
    endpoint: Endpoint,
    /// Print the tools as the server sent them (a JSON array).
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: ToolsArgs) -> ExitCode {
    super::block_on(async move {
        let client = match args.endpoint.connect(serde_json::json!({})).await {
            Ok(c) => c,
            Err(e) => return super::failed(e),
        };
        let listed = client.list_tools().await;
        super::close(&client).await;
        let tools = match listed {
            Ok(t) => t,
            Err(e) => return super::failed(format!("tools/list: {e}")),
        };
        if args.json {
            outln!("{:#}", serde_json::Value::Array(tools));
            return ExitCode::SUCCESS;
        }
        for tool in &tools {
            let name = tool["name"].as_str().unwrap_or("?");
            let signature = arguments::signature(&tool["inputSchema"]);
            match signature.as_str() {
                "" => outln!("{}", console::style(name).bold()),
                _ => outln!("{} {signature}", console::style(name).bold()),
            }
            if let Some(description) = tool["description"].as_str() {
                for line in description.lines().filter(|l| !l.trim().is_empty()) {
                    outln!("    {line}");
                }
            }
        }
        if tools.is_empty() {
            outln!("(no tools)");
        }
        ExitCode::SUCCESS
    })
}
