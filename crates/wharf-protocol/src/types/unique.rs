//! Objects read with each member name once. serde_json keeps the last of two members of one
//! name, where other readers keep the first: a gateway that checks a tool's arguments and
//! the server that runs the tool would read two different calls. So what a request hands an
//! application (a tool's or a prompt's arguments, a completion's, the answers to input
//! requests) is refused when an object in it, at any depth, names a member twice.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// `arguments` of `tools/call`: an object, or `null` for none.
pub(crate) fn object<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Map<String, Value>>, D::Error> {
    optional(d, UniqueValue)
}

/// `arguments` of `prompts/get` and `completion/complete`: strings by name.
pub(crate) fn strings<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    optional(d, PhantomData::<String>)
}

/// `inputResponses`: answers by the key of the input request they answer.
pub(crate) fn values<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, Value>>, D::Error> {
    optional(d, UniqueValue)
}

/// A map whose members are read with `seed`, or `None` for `null`.
fn optional<'de, D, S, M>(d: D, seed: S) -> Result<Option<M>, D::Error>
where
    D: Deserializer<'de>,
    S: DeserializeSeed<'de> + Copy,
    M: Members<S::Value>,
{
    struct Optional<S, M>(S, PhantomData<M>);
    impl<'de, S, M> Visitor<'de> for Optional<S, M>
    where
        S: DeserializeSeed<'de> + Copy,
        M: Members<S::Value>,
    {
        type Value = Option<M>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object or null")
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Option<M>, E> {
            Ok(None)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<M>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<M>, D::Error> {
            d.deserialize_map(Object(self.0, PhantomData)).map(Some)
        }
    }
    d.deserialize_option(Optional(seed, PhantomData))
}

/// A JSON object read into `M`, each value with the seed.
struct Object<S, M>(S, PhantomData<M>);

impl<'de, S, M> Visitor<'de> for Object<S, M>
where
    S: DeserializeSeed<'de> + Copy,
    M: Members<S::Value>,
{
    type Value = M;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<M, A::Error> {
        let mut members = M::default();
        while let Some(name) = map.next_key::<String>()? {
            let value = map.next_value_seed(self.0)?;
            if let Err(name) = members.insert_new(name, value) {
                return Err(A::Error::custom(twice(&name)));
            }
        }
        Ok(members)
    }
}

/// The refusal of an object that names member `name` twice.
pub(crate) fn twice(name: &str) -> String {
    format!("the member {name:?} is there twice (an object names each member once)")
}

/// Where an object's members go; `Err(name)` for a name already there.
pub(crate) trait Members<V>: Default {
    fn insert_new(&mut self, name: String, value: V) -> Result<(), String>;
}

impl Members<Value> for Map<String, Value> {
    fn insert_new(&mut self, name: String, value: Value) -> Result<(), String> {
        match self.entry(name) {
            serde_json::map::Entry::Vacant(e) => {
                e.insert(value);
                Ok(())
            }
            serde_json::map::Entry::Occupied(e) => Err(e.key().clone()),
        }
    }
}

impl<V> Members<V> for BTreeMap<String, V> {
    fn insert_new(&mut self, name: String, value: V) -> Result<(), String> {
        match self.entry(name) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(value);
                Ok(())
            }
            std::collections::btree_map::Entry::Occupied(e) => Err(e.key().clone()),
        }
    }
}

/// Any JSON value, its objects at every depth naming each member once.
#[derive(Clone, Copy)]
pub(crate) struct UniqueValue;

impl<'de> DeserializeSeed<'de> for UniqueValue {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        Object(self, PhantomData::<Map<String, Value>>)
            .visit_map(map)
            .map(Value::Object)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[derive(Debug, Deserialize)]
    struct Read {
        #[serde(default, deserialize_with = "object")]
        arguments: Option<Map<String, Value>>,
        #[serde(default, deserialize_with = "strings")]
        names: Option<BTreeMap<String, String>>,
        #[serde(default, deserialize_with = "values")]
        answers: Option<BTreeMap<String, Value>>,
    }

    fn read(text: &str) -> Result<Read, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_name_twice_at_any_depth_is_refused() {
        for (text, twice) in [
            (r#"{"arguments":{"path":"/public","path":"/etc"}}"#, "path"),
            (r#"{"arguments":{"a":{"b":[{"c":1,"c":2}]}}}"#, "c"),
            (r#"{"names":{"lang":"en","lang":"fr"}}"#, "lang"),
            (
                r#"{"answers":{"k":{"action":"accept","action":"decline"}}}"#,
                "action",
            ),
            (r#"{"answers":{"k":1,"k":2}}"#, "k"),
        ] {
            let e = read(text).unwrap_err();
            assert!(
                e.contains(&format!("the member {twice:?} is there twice")),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn what_names_each_member_once_reads_as_serde_json_reads_it() {
        let text = r#"{"arguments":{"a":[1,-2,2.5,1e300,null,true,"é",{"x":{}}],"b":{"a":1}},
            "names":{"lang":"en","b":"x"},"answers":{"k":{"action":"accept","content":{"n":3}}}}"#;
        let got = read(text).unwrap();
        let plain: Value = serde_json::from_str(text).unwrap();
        assert_eq!(Value::Object(got.arguments.unwrap()), plain["arguments"]);
        assert_eq!(json!(got.names.unwrap()), plain["names"]);
        assert_eq!(json!(got.answers.unwrap()), plain["answers"]);
        let none = read(r#"{"arguments":null,"names":null}"#).unwrap();
        assert!(none.arguments.is_none() && none.names.is_none() && none.answers.is_none());
        let e = read(r#"{"arguments":[1]}"#).unwrap_err();
        assert!(e.contains("expected a JSON object"), "{e}");
        let e = read(r#"{"names":{"a":1}}"#).unwrap_err();
        assert!(e.contains("expected a string"), "{e}");
    }
}
