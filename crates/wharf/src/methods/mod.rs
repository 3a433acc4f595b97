//! One module per method family. Each takes the registry, the runtime and a parsed request
//! (its scopes, capabilities and caps already admitted) and returns the whole response.

pub(crate) mod completion;
pub(crate) mod lists;
pub(crate) mod prompts;
pub(crate) mod resources;
pub(crate) mod tools;

use std::sync::Arc;

use wharf_protocol::RequestId;

use crate::meta::RequestInfo;
use crate::registry::Registry;
use crate::request::Caller;
use crate::runtime::Runtime;

/// A call of one method, as every method family takes it: what it runs against, and the
/// request's parts with its params typed (`()` until the method is known).
pub(crate) struct Call<'a, P> {
    pub(crate) registry: &'a Registry,
    pub(crate) runtime: &'a Arc<Runtime>,
    pub(crate) id: RequestId,
    pub(crate) info: Box<RequestInfo>,
    pub(crate) params: P,
    pub(crate) caller: Caller,
}

impl<'a> Call<'a, ()> {
    /// The same call, with the params of its method.
    pub(crate) fn with<P>(self, params: P) -> Call<'a, P> {
        let Call {
            registry,
            runtime,
            id,
            info,
            caller,
            ..
        } = self;
        Call {
            registry,
            runtime,
            id,
            info,
            params,
            caller,
        }
    }
}
