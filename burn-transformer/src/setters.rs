//! The `with_*` builder methods of option structs built by hand (Burn's `Config`
//! derive writes them for configs; these structs hold tensors, or constructors of
//! their own), written once.

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

pub(crate) use setters;
