//! `#[kernel]` for oxccl device code.
use proc_macro::TokenStream;

/// Marks a kernel (placeholder: passes the function through).
#[proc_macro_attribute]
pub fn kernel(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
