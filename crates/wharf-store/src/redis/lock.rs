//! Mutation locks on Redis: a FIFO line per key, whose head holds the lock as a lease with a
//! fencing token.
//!
//! Per key, a sorted set holds the line (tokens in arrival order) and a hash holds each
//! member's deadline in Redis's own clock. Tokens come from one counter for every key that
//! never expires: a key's line lapses when it goes idle, and a counter that lapsed with it
//! would hand a token out again, which a holder cut off from Redis meanwhile still carries
//! and would pass the fence with. Waiters poll their place, renewing a
//! short deadline each time; the head's deadline is the lease, renewed in the background
//! while it holds the key. A member past its deadline (its process died, or stalled) is
//! dropped from the head of the line by the next poll, so a crash blocks the key for at most
//! one lease.
//!
//! **Limits.** A lease is not a lock: a holder that stalls longer than the lease (a long GC
//! pause does not exist here, but a frozen VM or a partitioned network does) loses the key
//! while it still runs. Its store writes are fenced: every transaction written under the
//! lock carries the token, and the commit script applies nothing unless the token is still
//! the live head ([`StoreError::LeaseLost`]). Effects outside the store are not fenced.

use std::time::Duration;

use async_trait::async_trait;
use redis::Script;
use redis::aio::ConnectionManager;
use tokio::task::JoinHandle;
use wharf::store::{Fence, KeyLock, StoreError};

use super::backend;

/// How long a waiter stays in line without polling.
const WAITER_TTL_MS: u64 = 1_000;
/// The longest pause between two polls of a waiter.
const MAX_POLL: Duration = Duration::from_millis(50);

/// The keys of one line: the line, the deadlines, and the token counter all lines share.
pub(super) fn line_keys(key: &str) -> [String; 3] {
    [
        format!("wharf:m:{key}:line"),
        format!("wharf:m:{key}:alive"),
        TOKENS.to_owned(),
    ]
}

/// The token counter of every line; it has no expiry.
const TOKENS: &str = "wharf:m:tokens";

/// Joins the line; returns the member's token. Tokens start at 2^40: replicas of an earlier
/// release, still running during a rolling upgrade, count from 1 per key, and a token both
/// kinds handed out in one line would be held twice.
const ENTER_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = redis.call('INCR', KEYS[3]) + 1099511627776
redis.call('ZADD', KEYS[1], token, token)
redis.call('HSET', KEYS[2], token, now + tonumber(ARGV[1]))
for i = 1, 2 do redis.call('PEXPIRE', KEYS[i], ARGV[3]) end
return token
"#;

/// Renews the member's deadline, drops dead members from the head of the line, and says
/// where the member stands: 1 it holds the key (its deadline is now the lease), 0 it waits,
/// -1 it is no longer in line.
const POLL_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]
if not redis.call('ZSCORE', KEYS[1], token) then return -1 end
redis.call('HSET', KEYS[2], token, now + tonumber(ARGV[2]))
local head
while true do
  head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  local deadline = tonumber(redis.call('HGET', KEYS[2], head) or '0')
  if deadline >= now then break end
  redis.call('ZREM', KEYS[1], head)
  redis.call('HDEL', KEYS[2], head)
end
for i = 1, 2 do redis.call('PEXPIRE', KEYS[i], ARGV[4]) end
if head == token then
  redis.call('HSET', KEYS[2], token, now + tonumber(ARGV[3]))
  return 1
end
return 0
"#;

/// Leaves the line (holder or waiter).
const LEAVE_LUA: &str = r#"
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"#;

/// The scripts and settings of the lines of one store.
#[derive(Clone)]
pub(super) struct Lines {
    enter: Script,
    poll: Script,
    lease: Duration,
}

impl Lines {
    pub(super) fn new(lease: Duration) -> Self {
        Lines {
            enter: Script::new(ENTER_LUA),
            poll: Script::new(POLL_LUA),
            lease: lease.max(Duration::from_millis(300)),
        }
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX)
    }

    /// How long an idle line's keys are kept.
    fn keep_ms(&self) -> u64 {
        self.lease_ms().saturating_mul(4).max(60_000)
    }

    async fn poll(
        &self,
        conn: &mut ConnectionManager,
        keys: &[String; 3],
        token: u64,
    ) -> Result<i64, StoreError> {
        self.poll
            .key(&keys[0])
            .key(&keys[1])
            .key(&keys[2])
            .arg(token)
            .arg(WAITER_TTL_MS)
            .arg(self.lease_ms())
            .arg(self.keep_ms())
            .invoke_async(conn)
            .await
            .map_err(backend)
    }

    /// Waits for the key, first come first served; dropped while it waits, it leaves the line.
    pub(super) async fn lock(
        &self,
        conn: &ConnectionManager,
        key: &str,
    ) -> Result<Box<dyn KeyLock>, StoreError> {
        let mut conn = conn.clone();
        let keys = line_keys(key);
        'enter: loop {
            let token: u64 = self
                .enter
                .key(&keys[0])
                .key(&keys[1])
                .key(&keys[2])
                .arg(WAITER_TTL_MS)
                .arg(self.lease_ms())
                .arg(self.keep_ms())
                .invoke_async(&mut conn)
                .await
                .map_err(backend)?;
            let mut place = Place {
                conn: conn.clone(),
                keys: keys.clone(),
                token,
                left: false,
            };
            let mut pause = Duration::from_millis(1);
            loop {
                match self.poll(&mut conn, &keys, token).await? {
                    1 => {
                        let renew =
                            tokio::spawn(renew(self.clone(), conn.clone(), keys.clone(), token));
                        return Ok(Box::new(RedisKeyLock {
                            place,
                            key: key.to_owned(),
                            renew,
                        }));
                    }
                    // Dropped from the line (this process stalled past its deadline): join
                    // again at the back.
                    -1 => {
                        place.left = true;
                        continue 'enter;
                    }
                    _ => {
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(MAX_POLL).min(self.lease / 3);
                    }
                }
            }
        }
    }
}

/// Keeps the holder's lease alive until the lock is released (this task is aborted then).
async fn renew(lines: Lines, mut conn: ConnectionManager, keys: [String; 3], token: u64) {
    loop {
        tokio::time::sleep(lines.lease / 3).await;
        match lines.poll(&mut conn, &keys, token).await {
            Ok(1) => {}
            Ok(_) => {
                tracing::warn!(
                    "a mutation lease ran out while its call still ran; its writes will be refused"
                );
                return;
            }
            Err(e) => tracing::warn!(error = %e, "could not renew a mutation lease"),
        }
    }
}

/// A member's place in a line: leaves it when dropped, unless already gone.
struct Place {
    conn: ConnectionManager,
    keys: [String; 3],
    token: u64,
    left: bool,
}

impl Place {
    async fn leave(&mut self) -> Result<(), StoreError> {
        let _: i64 = Script::new(LEAVE_LUA)
            .key(&self.keys[0])
            .key(&self.keys[1])
            .arg(self.token)
            .invoke_async(&mut self.conn)
            .await
            .map_err(backend)?;
        // Only once Redis confirmed: a leave cut short is retried by the drop.
        self.left = true;
        Ok(())
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        self.left = true;
        // Tried once, by a task: a failure is left to the deadline. The task's copy never
        // leaves on its own drop: a runtime that shuts down drops the tasks spawned on it
        // unrun, and a copy that spawned again from its drop would do so without end.
        let mut place = Place {
            conn: self.conn.clone(),
            keys: self.keys.clone(),
            token: self.token,
            left: true,
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = place.leave().await {
                    tracing::warn!(error = %e, "could not leave a mutation line; the place lapses");
                }
            });
        }
    }
}

/// A held mutation lock on Redis.
struct RedisKeyLock {
    place: Place,
    key: String,
    renew: JoinHandle<()>,
}

impl Drop for RedisKeyLock {
    fn drop(&mut self) {
        self.renew.abort();
    }
}

#[async_trait]
impl KeyLock for RedisKeyLock {
    fn fence(&self) -> Option<Fence> {
        Some(Fence {
            key: self.key.clone(),
            token: self.place.token,
        })
    }

    async fn release(mut self: Box<Self>) {
        self.renew.abort();
        if let Err(e) = self.place.leave().await {
            tracing::warn!(error = %e, "could not release a mutation lock; it lapses with its lease");
        }
    }
}
