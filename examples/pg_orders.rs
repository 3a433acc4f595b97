//! A tool that writes its own PostgreSQL table, exactly once. The handler's statements run
//! in the call's transaction (`cx.tx()`), which commits together with the idempotency record:
//! a retry with the same `idempotency_key`, on any replica, even after a crash, returns the
//! first result and inserts nothing.
//!
//! ```text
//! cargo run -p wharf-examples --example pg_orders   # STORE=postgres://localhost/postgres, ADDR=127.0.0.1:8080
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::Executor;
use wharf::protocol::Implementation;
use wharf::{Context, HandlerError, Server, Structured, tool};
use wharf_http::HttpConfig;
use wharf_store::SqlTx;

/// The app's own table, next to the store's.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS example_orders (
    id BIGSERIAL PRIMARY KEY,
    item TEXT NOT NULL,
    quantity INTEGER NOT NULL
)";

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
    .map_err(HandlerError::internal)?;
    Ok(Structured(Placed { order }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::var("STORE").unwrap_or_else(|_| "postgres://localhost/postgres".into());
    let store = wharf_store::open(&url, &wharf_store::StoreOptions::default()).await?;
    // The app's migration: here one statement, run in a transaction of the store.
    let mut tx = store.begin(wharf::store::TxMode::Write).await?;
    let pg = tx
        .backend_tx()
        .downcast_mut::<SqlTx>()
        .and_then(SqlTx::postgres);
    let Some(pg) = pg else {
        anyhow::bail!("this example needs a PostgreSQL store, not {url}");
    };
    pg.execute(SCHEMA).await?;
    tx.commit().await?;
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
    let app = wharf_http::router(server, HttpConfig::default());
    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
