//! Records (see `wharf::store::Record`) in Redis: a hash per record (`v` value, `n` version,
//! `o` owner, `e` expiry) that Redis expires by itself, and per owner a sorted set of their
//! keys scored by expiry, for listing. Each operation is one script, so a conditional write
//! is atomic.

use redis::Script;
use redis::aio::ConnectionManager;
use wharf::store::{Millis, NewRecord, Record, StoreError, Write, fresh_version};

use super::{backend, corrupt, write_backend};

/// The record's key; the namespace's length goes first so no (namespace, key) pair spells
/// another's.
pub(crate) fn record_key(namespace: &str, key: &str) -> String {
    format!("wharf:r:{}:{namespace}:{key}", namespace.len())
}

/// The prefix of an owner's set in `namespace`; the owner follows. The write script builds
/// the previous owner's set from it.
fn owner_prefix(namespace: &str) -> String {
    format!("wharf:ro:{}:{namespace}:", namespace.len())
}

/// Writes when the condition holds (`create`: no live record; `replace`: the live record is
/// at the expected version); returns the new version, or nothing. Keeps the owners' sets:
/// the key leaves the previous owner's and joins the new owner's, scored by its expiry, and
/// a set's own expiry only ever lengthens (no expiry while a member has none).
const WRITE_LUA: &str = r#"
local k = KEYS[1]
local mode, value, owner, expires, now, expected, version, prefix, member =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local cur = redis.call('HMGET', k, 'n', 'e', 'o')
local live = cur[1] and (cur[2] == '' or tonumber(cur[2]) > now)
if mode == 'create' and live then return false end
if mode == 'replace' and not (live and cur[1] == expected) then return false end
redis.call('DEL', k)
redis.call('HSET', k, 'v', value, 'n', version, 'o', owner, 'e', expires)
if expires ~= '' then redis.call('PEXPIREAT', k, expires) end
if cur[3] and cur[3] ~= '' and cur[3] ~= owner then
  redis.call('ZREM', prefix .. cur[3], member)
end
if owner ~= '' then
  local set = prefix .. owner
  -- Members an hour past their expiry go (the hour covers clocks that differ between
  -- replicas; a listing skips expired members without removing them).
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now - 3600000)
  -- PTTL, not PEXPIRETIME (Redis 7): the set's expiry as now plus what is left.
  local ttl = redis.call('PTTL', set)
  if expires == '' then
    redis.call('ZADD', set, '+inf', member)
    redis.call('PERSIST', set)
  else
    redis.call('ZADD', set, expires, member)
    if ttl == -2 or (ttl >= 0 and now + ttl < tonumber(expires)) then
      redis.call('PEXPIREAT', set, expires)
    end
  end
end
return version
"#;

/// Deletes the record (only at the expected version, when one is given) and its place in
/// its owner's set; 1 when it went.
const DELETE_LUA: &str = r#"
local k = KEYS[1]
local expected, prefix, member = ARGV[1], ARGV[2], ARGV[3]
local cur = redis.call('HMGET', k, 'n', 'o')
if not cur[1] then return 0 end
if expected ~= '' and cur[1] ~= expected then return 0 end
redis.call('DEL', k)
if cur[2] and cur[2] ~= '' then redis.call('ZREM', prefix .. cur[2], member) end
return 1
"#;

/// An owner's live records, by key, at most `limit`: members whose record is gone or now
/// someone else's leave the set; expired ones are skipped (the write script removes them).
const LIST_LUA: &str = r#"
local set = KEYS[1]
local now, limit, records, owner = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local keys = redis.call('ZRANGEBYSCORE', set, '(' .. ARGV[1], '+inf')
table.sort(keys)
local out = {}
for _, member in ipairs(keys) do
  if #out >= limit * 4 then break end
  local r = redis.call('HMGET', records .. member, 'v', 'n', 'o', 'e')
  if r[2] and r[3] == owner and (r[4] == '' or tonumber(r[4]) > now) then
    table.insert(out, member); table.insert(out, r[1]); table.insert(out, r[2]); table.insert(out, r[4])
  else
    redis.call('ZREM', set, member)
  end
end
return out
"#;

/// The scripts, loaded once per store.
pub(super) struct Records {
    write: Script,
    delete: Script,
    list: Script,
}

impl Records {
    pub(super) fn new() -> Self {
        Self {
            write: Script::new(WRITE_LUA),
            delete: Script::new(DELETE_LUA),
            list: Script::new(LIST_LUA),
        }
    }

    pub(super) async fn read(
        &self,
        conn: &ConnectionManager,
        namespace: &str,
        key: &str,
        now: Millis,
    ) -> Result<Option<Record>, StoreError> {
        let mut conn = conn.clone();
        let fields: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(record_key(namespace, key))
            .arg(&["v", "n", "o", "e"])
            .query_async(&mut conn)
            .await
            .map_err(backend)?;
        let [value, version, owner, expires] = <[Option<String>; 4]>::try_from(fields)
            .map_err(|_| corrupt("record: HMGET answered the wrong number of fields"))?;
        let (Some(value), Some(version)) = (value, version) else {
            return Ok(None);
        };
        let record = parse(namespace, key, value, &version, owner, expires.as_deref())?;
        Ok(wharf::store::is_live(record.expires_at, now).then_some(record))
    }

    pub(super) async fn write(
        &self,
        conn: &ConnectionManager,
        record: &NewRecord<'_>,
        write: Write,
        now: Millis,
    ) -> Result<Option<u64>, StoreError> {
        let mut conn = conn.clone();
        let (mode, expected) = match write {
            Write::Create => ("create", String::new()),
            Write::Replace(version) => ("replace", version.to_string()),
            Write::Upsert => ("upsert", String::new()),
        };
        let written: Option<u64> = self
            .write
            .key(record_key(record.namespace, record.key))
            .arg(mode)
            .arg(record.value)
            .arg(record.owner.unwrap_or_default())
            .arg(
                record
                    .expires_at
                    .map(|at| at.to_string())
                    .unwrap_or_default(),
            )
            .arg(now)
            .arg(expected)
            .arg(fresh_version())
            .arg(owner_prefix(record.namespace))
            .arg(record.key)
            .invoke_async(&mut conn)
            .await
            .map_err(write_backend)?;
        Ok(written)
    }

    pub(super) async fn delete(
        &self,
        conn: &ConnectionManager,
        namespace: &str,
        key: &str,
        version: Option<u64>,
    ) -> Result<bool, StoreError> {
        let mut conn = conn.clone();
        let deleted: i64 = self
            .delete
            .key(record_key(namespace, key))
            .arg(version.map(|v| v.to_string()).unwrap_or_default())
            .arg(owner_prefix(namespace))
            .arg(key)
            .invoke_async(&mut conn)
            .await
            .map_err(write_backend)?;
        Ok(deleted == 1)
    }

    pub(super) async fn of_owner(
        &self,
        conn: &ConnectionManager,
        namespace: &str,
        owner: &str,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(String, Record)>, StoreError> {
        let mut conn = conn.clone();
        let flat: Vec<String> = self
            .list
            .key(format!("{}{owner}", owner_prefix(namespace)))
            .arg(now)
            .arg(limit)
            .arg(record_key(namespace, ""))
            .arg(owner)
            .invoke_async(&mut conn)
            .await
            .map_err(backend)?;
        flat.chunks_exact(4)
            .map(|row| {
                let [key, value, version, expires] = row else {
                    return Err(corrupt("record list: a row without four fields"));
                };
                let record = parse(
                    namespace,
                    key,
                    value.clone(),
                    version,
                    Some(owner.to_owned()),
                    Some(expires.as_str()),
                )?;
                Ok((key.clone(), record))
            })
            .collect()
    }
}

fn parse(
    namespace: &str,
    key: &str,
    value: String,
    version: &str,
    owner: Option<String>,
    expires: Option<&str>,
) -> Result<Record, StoreError> {
    let bad = || corrupt(&record_key(namespace, key));
    let version = version.parse::<u64>().map_err(|_| bad())?;
    let expires_at = match expires.unwrap_or_default() {
        "" => None,
        at => Some(at.parse::<Millis>().map_err(|_| bad())?),
    };
    Ok(Record {
        value,
        version,
        owner: owner.filter(|o| !o.is_empty()),
        expires_at,
    })
}
