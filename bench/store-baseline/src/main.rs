//! The baseline for `import_append_rows`: what a developer writes by hand for an idempotent
//! append, with the same drivers Wharf uses (sqlx's SQLite and PostgreSQL drivers).
//!
//! `POST /mcp` takes the same JSON-RPC `tools/call` as Wharf, and in one transaction inserts
//! an idempotency record for the call's key (a duplicate would get the stored result) and the
//! rows, as JSON text, in one multi-row insert, with ids from the database and an index to
//! read an import's rows back in order; then answers with the result. No handles, no
//! owners, no schema validation, no `_meta`: Wharf's numbers are compared against this one
//! (see `bench/store.sh`).
//!
//! Usage: `wharf-bench-store-baseline --db URL [--listen ADDR]` (sqlite:// or postgres://).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sqlx::{Executor, PgPool, SqlitePool};

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(borrow)]
    id: &'a RawValue,
    params: Params,
}

#[derive(Deserialize)]
struct Params {
    arguments: Args,
}

#[derive(Deserialize)]
struct Args {
    import: String,
    idempotency_key: String,
    rows: Vec<Map<String, Value>>,
}

enum App {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

async fn append(State(app): State<Arc<App>>, body: Bytes) -> Response {
    match run(&app, &body).await {
        Ok(out) => ([(header::CONTENT_TYPE, "application/json")], out).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    }
}

/// In the transaction `$tx`: the idempotency record, then (for a new key) the rows in one
/// multi-row insert whose placeholders `$param(i)` spells for row `i`.
macro_rules! insert {
    ($tx:expr, $args:ident, $result:ident, $param:expr) => {{
        let mut tx = $tx.map_err(|e| e.to_string())?;
        let fresh = sqlx::query(
            "INSERT INTO bench_idempotency (scope, key, result) VALUES ($1, $2, $3) \
             ON CONFLICT (scope, key) DO NOTHING",
        )
        .bind(&$args.import)
        .bind(&$args.idempotency_key)
        .bind(&$result)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?
        .rows_affected()
            == 1;
        if fresh && !$args.rows.is_empty() {
            // Row ids come from the database, as they must with several replicas.
            let values: Vec<String> = (0..$args.rows.len()).map($param).collect();
            let sql = format!(
                "INSERT INTO bench_rows (collection, doc) VALUES {}",
                values.join(",")
            );
            let mut q = sqlx::query(&sql);
            for row in $args.rows {
                q = q
                    .bind($args.import.as_str())
                    .bind(Value::Object(row).to_string());
            }
            q.execute(&mut *tx).await.map_err(|e| e.to_string())?;
        }
        tx.commit().await.map_err(|e| e.to_string())?;
    }};
}

async fn run(app: &App, body: &[u8]) -> Result<String, String> {
    let req: Request = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let args = req.params.arguments;
    let n = args.rows.len();
    let result = format!(r#"{{"appended":{n}}}"#);
    match app {
        App::Sqlite(pool) => {
            let pool = pool.clone();
            let tx = detached(async move { pool.begin_with("BEGIN IMMEDIATE").await }).await;
            insert!(tx, args, result, |_| "(?, ?)".to_owned())
        }
        App::Postgres(pool) => {
            let pool = pool.clone();
            let tx = detached(async move { pool.begin().await }).await;
            insert!(tx, args, result, |i| format!(
                "(${}, ${})",
                i * 2 + 1,
                i * 2 + 2
            ))
        }
    }
    Ok(format!(
        r#"{{"jsonrpc":"2.0","id":{},"result":{{"content":[{{"type":"text","text":{}}}],"structuredContent":{result}}}}}"#,
        req.id.get(),
        Value::String(result.clone())
    ))
}

/// Runs a begin to its end on a task of its own, as Wharf does: sqlx's begins are not
/// cancel-safe, and one dropped in flight (a client gone at the end of a wrk run) can put
/// its connection back in the pool inside the transaction, failing a later request with
/// "begin_with at non-zero transaction depth".
async fn detached<T: Send + 'static>(
    begin: impl Future<Output = Result<T, sqlx::Error>> + Send + 'static,
) -> Result<T, String> {
    tokio::spawn(begin)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut listen: SocketAddr = "127.0.0.1:8092".parse()?;
    let mut db = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--listen" => listen = args.next().ok_or("--listen needs an address")?.parse()?,
            "--db" => db = Some(args.next().ok_or("--db needs a URL")?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let db = db.ok_or("--db URL is required")?;
    let sqlite = db.starts_with("sqlite");
    let app = if sqlite {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(16)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    // As Wharf's store: every commit synced.
                    conn.execute("PRAGMA synchronous = FULL").await?;
                    conn.execute("PRAGMA busy_timeout = 10000").await?;
                    Ok(())
                })
            })
            .connect(&db)
            .await?;
        App::Sqlite(pool)
    } else {
        App::Postgres(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect(&db)
                .await?,
        )
    };
    // Rows are read back per import in order, as Wharf's are: an index on (collection, id).
    let id = if sqlite {
        "id INTEGER PRIMARY KEY"
    } else {
        "id BIGSERIAL PRIMARY KEY"
    };
    for ddl in [
        "DROP TABLE IF EXISTS bench_rows".to_owned(),
        "DROP TABLE IF EXISTS bench_idempotency".to_owned(),
        format!("CREATE TABLE bench_rows ({id}, collection TEXT NOT NULL, doc TEXT NOT NULL)"),
        "CREATE INDEX bench_rows_collection ON bench_rows (collection, id)".to_owned(),
        "CREATE TABLE bench_idempotency (scope TEXT NOT NULL, key TEXT NOT NULL, result TEXT, PRIMARY KEY (scope, key))".to_owned(),
    ] {
        match &app {
            App::Sqlite(pool) => pool.execute(&*ddl).await.map(drop)?,
            App::Postgres(pool) => pool.execute(&*ddl).await.map(drop)?,
        };
    }
    let app = Arc::new(app);
    let router = Router::new().route("/mcp", post(append)).with_state(app);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    axum::serve(listener, router).await?;
    Ok(())
}
