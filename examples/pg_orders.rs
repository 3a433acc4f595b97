//! A tool that writes its own PostgreSQL table, exactly once. The handler's statements run
//! in the call's transaction (`cx.tx()`), which commits together with the idempotency record:
//! a retry with the same `idempotency_key`, on any replica, even after a crash, returns the
//! first result and inserts nothing.
//!
//! ```text
//! cargo run -p wharf-examples --example pg_orders   # STORE=postgres://localhost/postgres, ADDR=127.0.0.1:8080
//! ```

use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use wharf::protocol::Implementation;
use wharf::{Context, HandlerError, Server, Structured, tool};
use wharf_http::{ConnectionLimits, HttpConfig};
use wharf_store::sql::db_error;
use wharf_store::{AppMigrations, SqlTx, StoreOptions};

#[derive(Deserialize, JsonSchema)]
struct Order {
    /// What to order.
    item: String,
    /// How many.
    #[schemars(range(min = 1, max = 1000))]
    quantity: i32,
}

#[derive(Serialize, JsonSchema)]
struct Placed {
    /// The new order's id.
    order: i64,
}

async fn place(cx: Context, args: Order) -> Result<Structured<Placed>, HandlerError> {
    let mut tx = cx.tx().await?;
    // The call's transaction, as sqlx's own `Transaction<Postgres>`.
    let pg = tx
        .backend_tx()
        .downcast_mut::<SqlTx>()
        .and_then(SqlTx::postgres)
        .ok_or_else(|| HandlerError::internal("this example needs a PostgreSQL store"))?;
    let order: i64 = sqlx::query_scalar(
        "INSERT INTO example_orders (item, quantity) VALUES ($1, $2) RETURNING id",
    )
    .bind(&args.item)
    .bind(args.quantity)
    .fetch_one(&mut **pg)
    .await
    // A lock wait that ran out or a busy pool is "busy, retry" (503), as the store's own.
    .map_err(db_error)?;
    Ok(Structured(Placed { order }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("STORE").unwrap_or_else(|_| "postgres://localhost/postgres".into());
    if !url.starts_with("postgres") {
        anyhow::bail!("this example needs a PostgreSQL store, not {url}");
    }
    // The app's tables are migrations the store applies when it opens, after its own, once
    // per database however many replicas start together (examples/migrations/pg_orders).
    let mut options = StoreOptions::default();
    options.app_migrations = Some(Arc::new(
        AppMigrations::new().postgres(sqlx::migrate!("./migrations/pg_orders")),
    ));
    let store = wharf_store::open(&url, &options).await?;
    let server = Server::builder(Implementation::new("orders", "1.0.0"))
        .store(store)
        .tool(
            tool("place_order")
                .description(
                    "Place an order. Retry with the same idempotency_key: it is placed once.",
                )
                .idempotent()
                .handler(place),
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
