//! A tool that asks the user to confirm before it acts (MRTR): the first call answers
//! `input_required` with a form; the client asks the user and calls again with the answer
//! and the sealed `requestState`; the handler runs again and reads the answer. The
//! confirmation is redeemed once, on any replica sharing the store: replaying it does
//! nothing.
//!
//! ```text
//! cargo run -p wharf-examples --example confirm     # ADDR=127.0.0.1:8080, STORE=sqlite://confirm.db
//! ```

use schemars::JsonSchema;
use serde::Deserialize;
use wharf::protocol::Implementation;
use wharf::{Context, Elicited, FormSchema, HandlerError, Server, tool};
use wharf_http::{ConnectionLimits, HttpConfig};

#[derive(Deserialize, JsonSchema)]
struct Delete {
    /// The file to delete.
    path: String,
}

/// What the form asks.
#[derive(Deserialize)]
struct Confirm {
    delete: bool,
}

async fn delete(cx: Context, args: Delete) -> Result<String, HandlerError> {
    let form = FormSchema::new().boolean("delete", "Delete it", true);
    match cx.elicited::<Confirm>("confirm", &form) {
        Some(Elicited::Accepted(Confirm { delete: true })) => {
            // Before the effect: a second retry with the same state is refused.
            cx.redeem_once().await?;
            Ok(format!("Deleted {}.", args.path))
        }
        Some(_) => Err(HandlerError::execution(format!(
            "Not deleted: the user did not confirm deleting {}.",
            args.path
        ))),
        None => Err(cx
            .ask()
            .elicit("confirm", format!("Delete {}?", args.path), form)
            .into()),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("STORE").unwrap_or_else(|_| "sqlite://confirm.db".into());
    let store = wharf_store::open(&url, &wharf_store::StoreOptions::default()).await?;
    let server = Server::builder(Implementation::new("confirm", "1.0.0"))
        .store(store)
        .tool(
            tool("delete_file")
                .description("Delete a file, once the user confirms.")
                .handler(delete),
        )
        .build()?;
    let app = wharf_http::router(server.clone(), HttpConfig::default());
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    // As in hello_tools: head read timeout, connection and header caps, drain on Ctrl-C.
    let shutdown = async move {
        let _ = tokio::signal::ctrl_c().await;
        // Listen and session streams end, so that their connections close too.
        server.shutdown();
    };
    wharf_http::serve(listener, app, ConnectionLimits::default(), shutdown).await?;
    Ok(())
}
