//! Builder boilerplate written once: the `with_*` setters of option structs built by
//! hand (Burn's `Config` derive writes them for configs; these structs hold tensors,
//! or constructors of their own), and the panicking `init` of every config with a
//! `try_init`.

/// `setters!(Type { /// doc \n with_field => field: Type, … })` implements
/// `pub fn with_field(self, field: Type) -> Self` for each listed field.
macro_rules! setters {
    ($type:ty { $( $(#[$doc:meta])* $method:ident => $field:ident: $value:ty ),* $(,)? }) => {
        impl $type {
            $(
                $(#[$doc])*
                pub fn $method(mut self, $field: $value) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}

/// `init_or_panic!(Config => Module)` implements `Config::init(&self, device)`: the
/// module of `try_init`, panicking with the message of its error.
macro_rules! init_or_panic {
    ($config:ty => $module:ty) => {
        impl $config {
            /// Builds the module.
            ///
            /// # Panics
            /// If the configuration is invalid, with the message of the error
            /// `try_init` returns.
            pub fn init(&self, device: &burn::tensor::Device) -> $module {
                self.try_init(device)
                    .unwrap_or_else(|error| panic!("{error}"))
            }
        }
    };
}

pub(crate) use {init_or_panic, setters};
