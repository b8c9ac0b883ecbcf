//! Mixture of experts: the router, the routed experts and their dispatch, the sparse
//! layer, and the plan of which decoder layers are sparse. A layer's feed-forward is a
//! [`FeedForward`](crate::ffn::FeedForward), of which [`Moe`] is one variant.

mod experts;
mod layer;
mod plan;
mod router;

pub use experts::{ExpertDispatch, ExpertGlu, Experts, ExpertsConfig};
pub use layer::{Moe, MoeConfig, MoeOutput};
pub use plan::MoeLayerPlan;
pub use router::{
    GroupScoring, Router, RouterConfig, RouterScoring, Routing, load_balancing_loss, router_z_loss,
};
