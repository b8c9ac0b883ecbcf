use burn::prelude::*;
#[derive(Config, Debug)]
pub struct RopeConfig {
    pub head_dim: usize,
}
impl RopeConfig {
    pub fn validate(&self) -> Result<(), crate::ConfigError> {
        Ok(())
    }
    pub fn try_init(&self, _device: &Device) -> Result<Rope, crate::ConfigError> {
        Ok(Rope {
            head_dim: self.head_dim,
        })
    }
    pub fn init(&self, device: &Device) -> Rope {
        self.try_init(device).unwrap()
    }
}
#[derive(Module, Debug)]
pub struct Rope {
    #[module(skip)]
    head_dim: usize,
}
impl Rope {
    pub fn forward(&self, x: Tensor<4>, _offset: usize) -> Tensor<4> {
        x
    }
    pub fn attention_scaling(&self) -> f64 {
        1.0
    }
    pub fn rotary_dim(&self) -> usize {
        self.head_dim
    }
}
