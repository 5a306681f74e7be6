//! `#[kernel]`: one Rust function, a PTX entry point on the GPU and a launchable shim on the
//! host (the CPU emulator).
//!
//! Use it through `oxccl_device::kernel`; the expansion names `::oxccl_device` paths.
use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, Ident, ItemFn, Pat, ReturnType, Type};

/// Turns a function into a kernel: a PTX `.entry` on the GPU, and on the host the same
/// function plus a module of the same name that launches it.
///
/// ```
/// use oxccl_device::{arch, kernel, DeviceSlice};
///
/// #[kernel]
/// pub fn write_ranks(out: DeviceSlice<u64>) {
///     let rank = arch::thread_rank_in_grid();
///     // SAFETY: each thread writes only its own element, and the host does not touch
///     // the buffer until the launch is synchronized.
///     unsafe { out.write(rank, rank) };
/// }
///
/// fn main() {
///     // On the host: the shim module, and the function itself (thread 0 of a 1x1 grid).
///     assert_eq!(write_ranks::KERNEL.name, "write_ranks");
///     assert_eq!(write_ranks::KERNEL.params.len(), 1);
///     let mut mem = [u64::MAX; 1];
///     write_ranks(DeviceSlice::new(mem.as_mut_ptr() as u64, 1));
///     assert_eq!(mem, [0]);
/// }
/// ```
///
/// `oxccl::Stream` documents a launch on the CPU backend from start to finish.
///
/// # On `nvptx64`
///
/// The function becomes an exported kernel entry point, its body unchanged:
///
/// ```ignore
/// #[unsafe(no_mangle)]
/// pub unsafe extern "ptx-kernel" fn write_ranks(out: DeviceSlice<u64>) { /* body */ }
/// ```
///
/// The `"ptx-kernel"` ABI is unstable, so a crate that defines kernels and is built for
/// nvptx64 needs `#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]` (oxccl-device
/// has it); the PTX build runs with `RUSTC_BOOTSTRAP=1` and `-Zbuild-std=core` anyway.
///
/// # On the host
///
/// The function stays as written (a direct call runs it on the calling thread, which sees
/// itself as thread 0 of a one-block, one-thread grid), and a module of the same name is
/// added next to it (functions and modules live in different namespaces):
///
/// ```ignore
/// pub mod write_ranks {
///     use super::*;
///     /// Name, parameter layouts and emulator entry point, for backends.
///     pub static KERNEL: ::oxccl_device::launch::KernelInfo = /* ... */;
///     /// Enqueues the kernel on `launcher` (a stream) with `config` and `args`.
///     pub fn launch<L: ::oxccl_device::launch::Launcher + ?Sized>(
///         launcher: &L,
///         config: ::oxccl_device::launch::LaunchConfig,
///         args: (DeviceSlice<u64>,),
///     ) -> Result<(), L::Error>;
/// }
/// ```
///
/// so that the host launches it with
/// `write_ranks::launch(&stream, LaunchConfig::grid(2).block(4), (buf.device_slice(),))?`.
/// `launch` builds the array of pointers to the arguments (what `cuLaunchKernel` takes as
/// `kernelParams`) and hands it to [`Launcher::launch_raw`], which copies the values before
/// returning. `KERNEL.host_entry` is the emulator's way in: it reads the parameters back
/// from such an array and calls the function.
///
/// Every parameter type must implement `oxccl_device::launch::KernelArg` (plain bytes:
/// every `bytemuck::Pod + Send + Sync` type does); this is checked at compile time, at
/// the parameter.
///
/// Put kernels at module level, not inside a function body: the generated module reaches
/// the function and the parameter types through `super::`, which cannot name items local
/// to a function.
///
/// # Refused (compile errors at the offending tokens)
///
/// Generic parameters (types, lifetimes, consts, `impl Trait`), a `self` receiver,
/// `async`, `const`, `unsafe` or `extern` functions, variadics, a return type other than
/// `()`, and parameter patterns other than a plain (optionally `mut`) identifier. A kernel
/// has one fixed ABI and returns nothing; the launch is a safe call, so unsafe operations
/// belong in `unsafe` blocks inside the body. For example:
///
/// ```compile_fail
/// #[oxccl_device::kernel]
/// fn generic<T: Copy>(x: T) {}
/// # fn main() {}
/// ```
/// ```compile_fail
/// #[oxccl_device::kernel]
/// fn returns() -> u32 { 0 }
/// # fn main() {}
/// ```
/// ```compile_fail
/// #[oxccl_device::kernel]
/// async fn not_async() {}
/// # fn main() {}
/// ```
/// ```compile_fail
/// #[oxccl_device::kernel]
/// fn pattern((a, b): (u32, u32)) {}
/// # fn main() {}
/// ```
/// ```compile_fail
/// // Not plain bytes: "`Vec<u8>` cannot be a kernel parameter".
/// #[oxccl_device::kernel]
/// fn not_pod(v: Vec<u8>) {}
/// # fn main() {}
/// ```
///
/// [`Launcher::launch_raw`]: https://docs.rs/oxccl-device/latest/oxccl_device/launch/trait.Launcher.html
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr = TokenStream2::from(attr);
    let item = TokenStream2::from(item);
    match expand(attr, item.clone()) {
        Ok(tokens) => tokens.into(),
        // Keep the item as written next to the error, so that its callers do not add
        // "cannot find function" errors of their own.
        Err(err) => {
            let mut tokens = err.to_compile_error();
            tokens.extend(item);
            tokens.into()
        }
    }
}

/// One kernel parameter: its binding and its type.
struct Param {
    ident: Ident,
    ty: Type,
}

fn expand(attr: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    if !attr.is_empty() {
        return Err(syn::Error::new(
            attr.span(),
            "#[kernel] takes no arguments; write `#[kernel]`",
        ));
    }
    let func: ItemFn = syn::parse2(item)?;
    let params = check(&func)?;

    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = &func;
    let name = &sig.ident;
    let name_str = name.to_string();
    let inputs = &sig.inputs;
    let kernel_doc = format!(
        "Launch shim of the kernel [`{name_str}`](fn@{name_str}) for host backends \
         (generated by `#[kernel]`)."
    );

    let ptx_entry = quote! {
        #[cfg(target_arch = "nvptx64")]
        #(#attrs)*
        #[unsafe(no_mangle)]
        #vis unsafe extern "ptx-kernel" fn #name(#inputs) #block
    };
    let host_fn = quote! {
        #[cfg(not(target_arch = "nvptx64"))]
        #(#attrs)*
        #vis fn #name(#inputs) #block
    };

    let tys: Vec<&Type> = params.iter().map(|p| &p.ty).collect();
    let count = params.len();
    let indices: Vec<syn::Index> = (0..count).map(syn::Index::from).collect();
    let reads: Vec<Ident> = params
        .iter()
        .map(|p| format_ident!("__{}", p.ident, span = p.ident.span()))
        .collect();
    // Spanned at each parameter type, so that a type that is not a `KernelArg` is reported
    // there, once, with the message of `__KernelParam`.
    let layouts = tys.iter().map(|ty| {
        quote_spanned! {ty.span()=>
            __param_layout::<#ty>()
        }
    });
    let tuple_ty = quote! { ( #(#tys,)* ) };

    let shim = quote! {
        #[cfg(not(target_arch = "nvptx64"))]
        #[doc = #kernel_doc]
        #[allow(unused_imports)]
        #vis mod #name {
            use super::*;

            /// Name, parameter layouts and emulator entry point of the kernel, for backends.
            pub static KERNEL: ::oxccl_device::launch::KernelInfo =
                ::oxccl_device::launch::KernelInfo {
                    name: #name_str,
                    params: &[ #( #layouts ),* ],
                    host_entry: __host_entry,
                };

            // Every parameter must be plain bytes the backend can copy. Checked through this
            // trait, so the error points at the offending parameter type and says why.
            #[diagnostic::on_unimplemented(
                message = "`{Self}` cannot be a kernel parameter",
                label = "not a `KernelArg`",
                note = "kernel parameters are copied as plain bytes: use a \
                        `bytemuck::Pod + Send + Sync + 'static` type \
                        (device memory as `DeviceSlice<T>` / `DevicePtr<T>`)"
            )]
            trait __KernelParam: ::oxccl_device::launch::KernelArg {}
            impl<T: ::oxccl_device::launch::KernelArg> __KernelParam for T {}
            const fn __param_layout<T: __KernelParam>() -> ::oxccl_device::launch::ParamLayout {
                ::oxccl_device::launch::ParamLayout::of::<T>()
            }

            /// Reads each parameter from `params` and runs the kernel on the calling thread.
            ///
            /// # Safety
            /// `params` must hold one pointer per parameter, the i-th aligned for and
            /// pointing to a valid value of the i-th parameter type.
            #[allow(unused_variables)]
            unsafe fn __host_entry(params: *const *const ::core::ffi::c_void) {
                #(
                    // SAFETY: the caller passes one valid, aligned pointer per parameter;
                    // parameter types are `Copy`, so reading leaves the source valid.
                    let #reads: #tys = unsafe {
                        ::core::ptr::read((*params.add(#indices)).cast::<#tys>())
                    };
                )*
                super::#name( #(#reads),* )
            }

            /// Enqueues the kernel on `launcher` (a stream) with `config` and `args`, one
            /// tuple element per kernel parameter. The arguments are copied before this
            /// returns; the kernel runs asynchronously.
            ///
            /// # Errors
            /// Whatever the launcher refuses: a configuration it cannot run, a stream that
            /// cannot take work.
            #[allow(unused_variables)]
            pub fn launch<L: ::oxccl_device::launch::Launcher + ?Sized>(
                launcher: &L,
                config: ::oxccl_device::launch::LaunchConfig,
                args: #tuple_ty,
            ) -> ::core::result::Result<(), L::Error> {
                let params: [*const ::core::ffi::c_void; #count] = [
                    #( (&args.#indices as *const #tys).cast::<::core::ffi::c_void>() ),*
                ];
                // SAFETY: `params` holds exactly one pointer per parameter of `KERNEL`, in
                // order, each to a live value of that parameter's type (`args` outlives the
                // call, and the launcher copies the values before returning).
                unsafe { launcher.launch_raw(&KERNEL, config, &params) }
            }
        }
    };

    Ok(quote! {
        #ptx_entry
        #host_fn
        #shim
    })
}

/// Refuses what a kernel cannot be, and returns its parameters.
fn check(func: &ItemFn) -> syn::Result<Vec<Param>> {
    let sig = &func.sig;
    let mut errors: Option<syn::Error> = None;
    let mut push = |err: syn::Error| match &mut errors {
        Some(all) => all.combine(err),
        None => errors = Some(err),
    };

    if let Some(token) = &sig.asyncness {
        push(syn::Error::new(token.span(), "a kernel cannot be `async`"));
    }
    if let Some(token) = &sig.constness {
        push(syn::Error::new(token.span(), "a kernel cannot be `const`"));
    }
    if let Some(token) = &sig.unsafety {
        push(syn::Error::new(
            token.span(),
            "a kernel cannot be `unsafe fn`: launching it is a safe call, so put `unsafe` \
             blocks (with their `// SAFETY:` reasons) inside the body",
        ));
    }
    if let Some(abi) = &sig.abi {
        push(syn::Error::new(
            abi.span(),
            "a kernel cannot declare an ABI: `#[kernel]` chooses it per target",
        ));
    }
    if !sig.generics.params.is_empty() {
        push(syn::Error::new(
            sig.generics.params.span(),
            "a kernel cannot be generic: a PTX entry point has one fixed parameter list",
        ));
    }
    if let Some(clause) = &sig.generics.where_clause {
        push(syn::Error::new(
            clause.span(),
            "a kernel cannot have a `where` clause: it cannot be generic",
        ));
    }
    if let Some(variadic) = &sig.variadic {
        push(syn::Error::new(
            variadic.span(),
            "a kernel cannot be variadic",
        ));
    }
    if let ReturnType::Type(_, ty) = &sig.output {
        let unit = matches!(&**ty, Type::Tuple(t) if t.elems.is_empty());
        if !unit {
            push(syn::Error::new(
                ty.span(),
                "a kernel returns nothing: write results to device memory instead",
            ));
        }
    }

    let mut params = Vec::new();
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(recv) => push(syn::Error::new(
                recv.span(),
                "a kernel cannot take `self`: it is a free function",
            )),
            FnArg::Typed(typed) => {
                let ident = match &*typed.pat {
                    Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => {
                        Some(p.ident.clone())
                    }
                    other => {
                        push(syn::Error::new(
                            other.span(),
                            "kernel parameters must be plain identifiers (`name: Type`)",
                        ));
                        None
                    }
                };
                if let Some(span) = impl_trait_span(&typed.ty) {
                    push(syn::Error::new(
                        span,
                        "a kernel cannot be generic: `impl Trait` parameters are generic",
                    ));
                }
                if let Some(ident) = ident {
                    params.push(Param {
                        ident,
                        ty: (*typed.ty).clone(),
                    });
                }
            }
        }
    }

    match errors {
        Some(err) => Err(err),
        None => Ok(params),
    }
}

/// The span of an `impl Trait` anywhere in `ty`, if there is one.
fn impl_trait_span(ty: &Type) -> Option<Span> {
    struct Finder(Option<Span>);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, node: &'ast syn::TypeImplTrait) {
            self.0.get_or_insert(node.span());
        }
    }
    let mut finder = Finder(None);
    syn::visit::Visit::visit_type(&mut finder, ty);
    finder.0
}
