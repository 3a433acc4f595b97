//! PostgreSQL's control session: the connection that says a replica and its store are alive
//! (the readiness ping, the change bus's heartbeat), beside the calls' pool.
//!
//! Through the calls' pool, calls holding all of its connections (long handlers in their
//! transactions; under load, on every replica at once) would fail `/readyz` fleet-wide,
//! taking every replica out of the balancer together, and silence every heartbeat, so that
//! every listener took the bus for lost. Busy is what admission answers calls; alive is
//! what this says.
//!
//! Not a pool of one: a pool hands a connection whose statement was cut short back through
//! a ping without a time limit, and a connection to a server that vanished without a word
//! (a failover that drops packets) would hold the only one until the kernel gives up, a
//! quarter of an hour. Here every use is bounded by [`ANSWER_WITHIN`], and a connection is
//! kept only after a statement it answered: one cut short is dropped, which closes it at
//! once, and the next use opens another.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::postgres::{PgArguments, PgConnectOptions};
use sqlx::query::Query;
use sqlx::{ConnectOptions, Connection, PgConnection, Postgres};

use super::{call_session, connection_lost};

/// How long one use may take, connecting included: under the 5 s a readiness check gets,
/// so that a stuck session fails the check instead of hanging it, and well under the
/// heartbeat interval. Its statements' lock waits end sooner.
const ANSWER_WITHIN: Duration = Duration::from_secs(4);

/// The `lock_timeout` of the session, in milliseconds: `pg_notify` waits for the queue's
/// lock at commit, behind a notifying commit that stalls.
const LOCK_WAIT_MS: u128 = 2_000;

/// Why a use of the control session failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    /// The database refused, or the connection failed.
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    /// No answer within [`ANSWER_WITHIN`].
    #[error("no answer from PostgreSQL within {} s", ANSWER_WITHIN.as_secs())]
    TimedOut,
}

/// One PostgreSQL connection of its own, opened when first needed and again after any
/// failure.
pub(crate) struct ControlSession {
    options: PgConnectOptions,
    /// The connection, while no use holds it; empty before the first use, after a failed
    /// one, and while a use runs (a use beside it opens a second connection, kept if the
    /// slot is free when it ends).
    idle: Mutex<Option<PgConnection>>,
}

impl ControlSession {
    /// A session that connects with `options` (the calls' pool's, its `application_name`
    /// included).
    pub(crate) fn new(options: PgConnectOptions) -> Self {
        ControlSession {
            options,
            idle: Mutex::new(None),
        }
    }

    /// Runs the statement `query` makes and discards its rows. A kept connection found lost
    /// (the server restarted, failed over, or ended the session) is replaced at once, within
    /// the same time: every replica's is lost together in a failover, and their checks must
    /// not all fail for it.
    pub(crate) async fn execute<'q>(
        &self,
        query: impl Fn() -> Query<'q, Postgres, PgArguments>,
    ) -> Result<(), ControlError> {
        let kept = self.idle.lock().unwrap_or_else(|p| p.into_inner()).take();
        let used = tokio::time::timeout(ANSWER_WITHIN, async {
            if let Some(mut conn) = kept {
                match query().execute(&mut conn).await {
                    Ok(_) => return Ok(conn),
                    Err(e) if !connection_lost(&e) => return Err(e.into()),
                    Err(_) => {}
                }
            }
            let mut conn = self.options.connect().await?;
            call_session(&mut conn, LOCK_WAIT_MS).await?;
            query().execute(&mut conn).await?;
            Ok::<_, ControlError>(conn)
        })
        .await;
        // On any failure the connection was dropped with the future that held it, which
        // closes it without waiting for anything.
        let conn = used.map_err(|_| ControlError::TimedOut)??;
        let spare = {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.is_none() {
                *idle = Some(conn);
                None
            } else {
                Some(conn)
            }
        };
        if let Some(spare) = spare {
            // A second connection, opened while another use held the first: said goodbye
            // to, so that the server does not log it as lost.
            let _ = tokio::time::timeout(ANSWER_WITHIN, spare.close()).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use wharf::store::now_millis;

    use super::*;

    fn session() -> ControlSession {
        let url = std::env::var("WHARF_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
        ControlSession::new(url.parse().expect("a PostgreSQL URL"))
    }

    fn select_1() -> Query<'static, Postgres, PgArguments> {
        sqlx::query("SELECT 1")
    }

    /// A use that does not answer in time fails, and takes its connection with it: the
    /// next use answers on a new one, where a pool would first wait for the old one's
    /// statement to end.
    #[tokio::test]
    async fn a_use_cut_short_leaves_nothing_behind() {
        let session = session();
        session.execute(select_1).await.unwrap();
        let stuck = session.execute(|| sqlx::query("SELECT pg_sleep(20)")).await;
        assert!(matches!(stuck, Err(ControlError::TimedOut)), "{stuck:?}");
        session.execute(select_1).await.unwrap();
    }

    /// A kept connection the server ended (a restart, a failover) is replaced within the
    /// use that finds it lost: the use answers.
    #[tokio::test]
    async fn a_session_the_server_ended_is_replaced_at_once() {
        let session = session();
        // A statement no other run's session runs, to find this one's backend by.
        let marked = format!(
            "SELECT 'control session under test {} {}'",
            std::process::id(),
            now_millis()
        );
        session.execute(|| sqlx::query(&marked)).await.unwrap();
        let mut observer = session.options.connect().await.unwrap();
        let ended: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND query = $1) AS t",
        )
        .bind(&marked)
        .fetch_one(&mut observer)
        .await
        .unwrap();
        assert_eq!(ended, 1);
        session.execute(select_1).await.unwrap();
    }
}
