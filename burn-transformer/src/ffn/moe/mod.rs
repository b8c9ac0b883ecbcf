//! Mixture of experts: the router, the routed experts and their dispatch, the sparse
//! layer, and the dense-or-sparse feed-forward choice of a decoder layer.

mod experts;
mod feed_forward;
mod layer;
mod router;

pub use experts::{DispatchPlan, ExpertDispatch, Experts, ExpertsConfig, PaddedLayout};
pub use feed_forward::{
    FeedForward, FeedForwardConfig, FeedForwardOutput, MoeLayerPlan, dense_config_from_hf,
};
pub use layer::{Moe, MoeConfig, MoeOutput};
pub use router::{
    GroupScoring, Router, RouterConfig, RouterScoring, Routing, load_balancing_loss, router_z_loss,
};
