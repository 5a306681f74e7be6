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
/// /// Each thread writes its rank in the grid at that rank.
/// ///
/// /// # Safety
/// /// `out` must be writable device memory of at least one element per thread of the grid,
/// /// which nothing else touches until the launch completes.
/// #[kernel]
/// pub unsafe fn write_ranks(out: DeviceSlice<u64>) {
///     let rank = arch::thread_rank_in_grid();
///     // SAFETY: the contract above; each thread writes only its own element.
///     unsafe { out.write(rank, rank) };
/// }
///
/// fn main() {
///     // On the host: the shim module, and the function itself (thread 0 of a 1x1 grid).
///     assert_eq!(write_ranks::KERNEL.name, "write_ranks");
///     assert_eq!(write_ranks::KERNEL.params.len(), 1);
///     let mut mem = [u64::MAX; 1];
///     // SAFETY: `mem` holds the one element of the one thread this call is.
///     unsafe { write_ranks(DeviceSlice::new(mem.as_mut_ptr() as u64, 1)) };
///     assert_eq!(mem, [0]);
/// }
/// ```
///
/// `oxccl::Stream` documents a launch on the CPU backend from start to finish.
///
/// # On `nvptx64`
///
/// The function becomes an exported kernel entry point that runs the body as written:
///
/// ```ignore
/// #[unsafe(no_mangle)]
/// pub unsafe extern "ptx-kernel" fn write_ranks(out: DeviceSlice<u64>) {
///     /* the body, as an inline function; the block count check of `max_blocks`;
///        a trap for an error no abort record can carry */
/// }
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
///     /// Enqueues the kernel on `launcher` (a stream) with `config` and the kernel's
///     /// arguments (`unsafe`, as the kernel is).
///     pub unsafe fn launch<L: ::oxccl_device::launch::Launcher + ?Sized>(
///         launcher: &L,
///         config: ::oxccl_device::launch::LaunchConfig,
///         out: DeviceSlice<u64>,
///     ) -> Result<(), L::Error>;
/// }
/// ```
///
/// so that the host launches it with
/// `unsafe { write_ranks::launch(&stream, LaunchConfig::grid(2).block(4), buf.device_slice()) }?`.
/// `launch` builds the array of pointers to the arguments (what `cuLaunchKernel` takes as
/// `kernelParams`) and hands it to [`Launcher::launch_raw`], which copies the values before
/// returning. `KERNEL.host_entry` is the emulator's way in: it reads the parameters back
/// from such an array and calls the function.
///
/// Every parameter type must implement `oxccl_device::launch::KernelArg` (plain bytes:
/// every `bytemuck::Pod + Send + Sync` type, the device handles, and structs of those with
/// `#[derive(KernelArg)]`); this is checked at compile time, at the parameter. Handles carry
/// the lifetime of the host object they came from: write it in the signature
/// (`chan: PortChannelDeviceHandle<'_>`), so a handle cannot be launched after its channel
/// is gone.
///
/// `launch` takes the launcher and the configuration first, under those names, so a kernel
/// parameter cannot be called `launcher` or `config`:
///
/// ```compile_fail
/// #[oxccl_device::kernel]
/// pub fn scaled(config: u32) {}
/// # fn main() {}
/// ```
///
/// # Options
///
/// `#[kernel(max_blocks = N)]`: the kernel supports at most `N` blocks per launch (a kernel
/// written for one block, say). Launchers refuse a larger grid with an error naming the
/// kernel and the launch; on the GPU the kernel also traps if launched so some other way.
///
/// `#[kernel(cooperative)]`: the kernel synchronizes its whole grid (a grid barrier), so
/// every block of a launch must be resident on the device at once. `KERNEL.cooperative`
/// says so, and launchers refuse a grid larger than the device holds at once, naming the
/// kernel and the launch (the CPU emulator holds as many threads as it runs per launch; a
/// GPU what the occupancy API allows). The options combine:
/// `#[kernel(cooperative, max_blocks = 8)]`.
///
/// ```
/// use oxccl_device::{DeviceError, grid_barrier::GridBarrierDeviceHandle, kernel};
///
/// /// Two phases every block of the grid finishes together.
/// #[kernel(cooperative)]
/// pub fn two_phases(barrier: GridBarrierDeviceHandle<'_>) -> Result<(), DeviceError> {
///     // .. phase one ..
///     barrier.sync_grid()?;
///     // .. phase two sees every block's phase one ..
///     Ok(())
/// }
///
/// fn main() {
///     assert!(two_phases::KERNEL.cooperative);
/// }
/// ```
///
/// # Unsafe kernels and what they return
///
/// A kernel that dereferences raw addresses it was given (`u64`, [`DeviceSlice`]) trusts its
/// arguments: write it as `unsafe fn` with a `# Safety` section, and its `launch` is an
/// `unsafe fn` too, so safe code cannot hand it forged addresses:
///
/// ```compile_fail,E0133
/// use oxccl_device::{kernel, launch::{LaunchConfig, Launcher}};
///
/// /// # Safety
/// /// `addr` must point to a writable `u64`.
/// #[kernel]
/// pub unsafe fn store_one(addr: u64) {
///     // SAFETY: the caller's contract.
///     unsafe { (addr as *mut u64).write(1) };
/// }
///
/// fn forge<L: Launcher>(stream: &L) {
///     // error[E0133]: call to unsafe function is unsafe
///     let _ = store_one::launch(stream, LaunchConfig::grid(1), 0xdead_beef);
/// }
/// # fn main() {}
/// ```
///
/// A kernel may return `Result<(), DeviceError>` and use `?` on device calls. The CPU
/// emulator reports a returned error from `synchronize`, with the failing call; on the GPU a
/// failure is recorded in the channel's abort record (and a failure that has no record, a
/// zeroed handle, traps).
///
/// Put kernels at module level, not inside a function body: the generated module reaches
/// the function and the parameter types through `super::`, which cannot name items local
/// to a function.
///
/// # Refused (compile errors at the offending tokens)
///
/// Type or const generic parameters and `impl Trait` (lifetimes are fine), a `self`
/// receiver, `async` or `const` functions, an `extern` ABI, variadics, a return type other
/// than `()` or `Result<(), DeviceError>`, and parameter patterns other than a plain
/// (optionally `mut`) identifier. For example:
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
/// [`DeviceSlice`]: https://docs.rs/oxccl-device/latest/oxccl_device/struct.DeviceSlice.html
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

/// Implements `oxccl_device::launch::KernelArg` for a struct whose fields all implement it,
/// so the struct can be a kernel parameter (an argument struct instead of a long list of
/// positional parameters).
///
/// ```
/// use oxccl_device::{KernelArg, memory_channel::MemoryChannelDeviceHandle};
///
/// #[repr(C)]
/// #[derive(Clone, Copy, KernelArg)]
/// pub struct ExchangeArgs<'a> {
///     pub next: MemoryChannelDeviceHandle<'a>,
///     pub prev: MemoryChannelDeviceHandle<'a>,
///     pub bytes: u64,
/// }
/// # fn main() {}
/// ```
///
/// A field that is not a `KernelArg` is a compile error at the field:
///
/// ```compile_fail
/// #[derive(Clone, Copy, oxccl_device::KernelArg)]
/// struct Bad { pointer: &'static u8 }
/// # fn main() {}
/// ```
///
/// So is padding (the host reads an argument's bytes, and padding bytes are not
/// initialized); add an explicit `reserved` field instead:
///
/// ```compile_fail
/// #[repr(C)]
/// #[derive(Clone, Copy, oxccl_device::KernelArg)]
/// struct Padded { count: u32, bytes: u64 }
/// # fn main() {}
/// ```
///
/// ```
/// #[repr(C)]
/// #[derive(Clone, Copy, oxccl_device::KernelArg)]
/// struct Filled { count: u32, reserved: u32, bytes: u64 }
/// # fn main() {}
/// ```
#[proc_macro_derive(KernelArg)]
pub fn derive_kernel_arg(item: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(item as syn::DeriveInput);
    match derive_kernel_arg_impl(&input) {
        Ok(tokens) => tokens.into(),
        Err(err) => err.to_compile_error().into(),
    }
}

fn derive_kernel_arg_impl(input: &syn::DeriveInput) -> syn::Result<TokenStream2> {
    let syn::Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(
            input.ident.span(),
            "#[derive(KernelArg)] supports structs only",
        ));
    };
    let name = &input.ident;
    if let Some(param) = input
        .generics
        .params
        .iter()
        .find(|p| !matches!(p, syn::GenericParam::Lifetime(_)))
    {
        return Err(syn::Error::new(
            param.span(),
            "#[derive(KernelArg)] supports lifetime parameters only: a kernel argument has one \
             fixed layout, checked for padding here",
        ));
    }
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    // No padding: the host reads a kernel argument's bytes (a launch on the CPU backend
    // looks in them for addresses of GPU memory), and padding bytes are not initialized.
    let lifetimes = input.generics.lifetimes().map(|_| quote! { 'static });
    let whole = quote! { #name<#(#lifetimes),*> };
    let field_sizes = data.fields.iter().map(|f| {
        let ty = with_static_lifetimes(&f.ty);
        quote! { + ::core::mem::size_of::<#ty>() }
    });
    let message = format!(
        "`{name}` has padding: every byte of a kernel argument must belong to a field (order \
         the fields by alignment, or add explicit `reserved` fields)"
    );
    // Each field checked at its own span, so a field that is not a `KernelArg` is an error
    // there, at the derive, rather than wherever the struct is later launched.
    let checks = data.fields.iter().map(|f| {
        let ty = &f.ty;
        quote_spanned! {ty.span()=>
            __is_kernel_arg::<#ty>();
        }
    });
    let bounds = data.fields.iter().map(|f| {
        let ty = &f.ty;
        quote! { #ty: ::oxccl_device::launch::KernelArg }
    });
    let mut predicates: Vec<TokenStream2> = bounds.collect();
    if let Some(w) = where_clause {
        predicates.extend(w.predicates.iter().map(|p| quote! { #p }));
    }
    Ok(quote! {
        // SAFETY: every field is a `KernelArg` (required below), so every value safe code can
        // build field by field is one; the derive adds no operation of its own.
        unsafe impl #impl_generics ::oxccl_device::launch::KernelArg for #name #ty_generics
        where #(#predicates,)* {}
        const _: () = assert!(
            ::core::mem::size_of::<#whole>() == 0 #(#field_sizes)*,
            #message
        );
        const _: () = {
            fn __is_kernel_arg<T: ::oxccl_device::launch::KernelArg>() {}
            #[allow(dead_code)]
            fn __check_fields #impl_generics () #where_clause {
                #(#checks)*
            }
        };
    })
}

/// One kernel parameter: its binding and its type.
struct Param {
    ident: Ident,
    ty: Type,
}

/// What `#[kernel(...)]` may say.
#[derive(Default)]
struct KernelAttr {
    /// Most blocks per launch (0: any).
    max_blocks: u32,
    /// The kernel synchronizes its whole grid: its blocks must all be resident at once.
    cooperative: bool,
}

fn parse_attr(attr: TokenStream2) -> syn::Result<KernelAttr> {
    let mut out = KernelAttr::default();
    if attr.is_empty() {
        return Ok(out);
    }
    let parser = syn::meta::parser(|meta| {
        if meta.path.is_ident("max_blocks") {
            let n: syn::LitInt = meta.value()?.parse()?;
            out.max_blocks = n.base10_parse()?;
            if out.max_blocks == 0 {
                return Err(meta.error("max_blocks must be at least 1"));
            }
            Ok(())
        } else if meta.path.is_ident("cooperative") {
            if out.cooperative {
                return Err(meta.error("`cooperative` given twice"));
            }
            out.cooperative = true;
            Ok(())
        } else {
            Err(meta.error("#[kernel] takes only `max_blocks = N` and `cooperative`"))
        }
    });
    syn::parse::Parser::parse2(parser, attr)?;
    Ok(out)
}

/// `ty` with every lifetime (elided `'_` or named) replaced by `'static`: the form the
/// generated statics and the emulator entry, which sit outside any function signature,
/// can name.
fn with_static_lifetimes(ty: &Type) -> Type {
    struct ToStatic;
    impl syn::visit_mut::VisitMut for ToStatic {
        fn visit_lifetime_mut(&mut self, l: &mut syn::Lifetime) {
            *l = syn::Lifetime::new("'static", l.span());
        }
    }
    let mut ty = ty.clone();
    syn::visit_mut::VisitMut::visit_type_mut(&mut ToStatic, &mut ty);
    ty
}

fn expand(attr: TokenStream2, item: TokenStream2) -> syn::Result<TokenStream2> {
    let attr = parse_attr(attr)?;
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
    let output = &sig.output;
    let generics = &sig.generics;
    let lifetimes: Vec<&syn::LifetimeParam> = generics.lifetimes().collect();
    let is_unsafe = sig.unsafety.is_some();
    let unsafety = &sig.unsafety;
    let max_blocks = attr.max_blocks;
    let cooperative = attr.cooperative;
    let kernel_doc = format!(
        "Launch shim of the kernel [`{name_str}`](fn@{name_str}) for host backends \
         (generated by `#[kernel]`)."
    );

    let idents: Vec<&Ident> = params.iter().map(|p| &p.ident).collect();
    let tys: Vec<&Type> = params.iter().map(|p| &p.ty).collect();
    let static_tys: Vec<Type> = tys.iter().map(|t| with_static_lifetimes(t)).collect();

    let body_call = if is_unsafe {
        quote! {
            // SAFETY: the kernel's contract is the launch's: whoever launched it through
            // the `unsafe` `launch` (or a raw driver call) vouched for its arguments.
            unsafe { __kernel_body(#(#idents),*) }
        }
    } else {
        quote! { __kernel_body(#(#idents),*) }
    };
    let ptx_entry = quote! {
        #[cfg(target_arch = "nvptx64")]
        #(#attrs)*
        #[unsafe(no_mangle)]
        #vis unsafe extern "ptx-kernel" fn #name #generics ( #(#idents: #tys),* ) {
            #[inline(always)]
            #unsafety fn __kernel_body #generics (#inputs) #output #block
            ::oxccl_device::kernel_return::check_blocks_on_device(#max_blocks);
            ::oxccl_device::kernel_return::finish_on_device(#body_call);
        }
    };
    let host_fn = quote! {
        #[cfg(not(target_arch = "nvptx64"))]
        #(#attrs)*
        #vis #unsafety fn #name #generics (#inputs) #output #block
    };

    let count = params.len();
    let indices: Vec<syn::Index> = (0..count).map(syn::Index::from).collect();
    let reads: Vec<Ident> = params
        .iter()
        .map(|p| format_ident!("__{}", p.ident, span = p.ident.span()))
        .collect();
    // Spanned at each parameter type, so that a type that is not a `KernelArg` is reported
    // there, once, with the message of `__KernelParam`.
    let layouts = static_tys.iter().zip(&tys).map(|(sty, ty)| {
        quote_spanned! {ty.span()=>
            __param_layout::<#sty>()
        }
    });
    let host_call = if is_unsafe {
        quote! {
            // SAFETY: `HostEntry`'s contract: for an `unsafe` kernel the caller of the
            // unsafe `launch` vouched for the kernel's contract.
            unsafe { super::#name( #(#reads),* ) }
        }
    } else {
        quote! { super::#name( #(#reads),* ) }
    };
    let (launch_unsafety, launch_safety_doc) = if is_unsafe {
        (
            quote! { unsafe },
            format!(
                "\n\n# Safety\nThe safety contract of [`{name_str}`](fn@super::{name_str}) \
                 must hold for the arguments and `config`."
            ),
        )
    } else {
        (quote! {}, String::new())
    };
    let launch_doc = format!(
        "Enqueues the kernel on `launcher` (a stream) with `config` and the kernel's \
         arguments, in the order of its parameters. They are copied before this returns; the \
         kernel runs asynchronously.\n\n# Errors\nWhatever the launcher refuses: a \
         configuration it cannot run (more blocks than the kernel's `max_blocks`, or than \
         the device holds at once for a cooperative kernel), a stream that cannot take work.{launch_safety_doc}"
    );
    let shim = quote! {
        #[cfg(not(target_arch = "nvptx64"))]
        #[doc = #kernel_doc]
        #[allow(unused_imports)]
        #vis mod #name {
            use super::*;

            /// Name, parameter layouts, emulator entry point and launch limits (most
            /// blocks, cooperative) of the kernel, for backends.
            pub static KERNEL: ::oxccl_device::launch::KernelInfo =
                ::oxccl_device::launch::KernelInfo {
                    name: #name_str,
                    module: ::core::env!("CARGO_CRATE_NAME"),
                    params: &[ #( #layouts ),* ],
                    host_entry: __host_entry,
                    max_blocks: #max_blocks,
                    cooperative: #cooperative,
                };

            // Every parameter must be plain bytes the backend can copy. Checked through this
            // trait, so the error points at the offending parameter type and says why.
            #[diagnostic::on_unimplemented(
                message = "`{Self}` cannot be a kernel parameter",
                label = "not a `KernelArg`",
                note = "kernel parameters are copied as plain bytes: use a \
                        `bytemuck::Pod + Send + Sync` type, a device handle, or a struct \
                        of those with `#[derive(KernelArg)]` (device memory as \
                        `DeviceSlice<T>` / `DevicePtr<T>`)"
            )]
            trait __KernelParam: ::oxccl_device::launch::KernelArg {}
            impl<T: ::oxccl_device::launch::KernelArg> __KernelParam for T {}
            const fn __param_layout<T: __KernelParam>() -> ::oxccl_device::launch::ParamLayout {
                ::oxccl_device::launch::ParamLayout::of::<T>()
            }

            /// Reads each parameter from `params`, runs the kernel on the calling thread and
            /// returns what it returned.
            ///
            /// # Safety
            /// `params` must hold one pointer per parameter, the i-th aligned for and
            /// pointing to a valid value of the i-th parameter type; for an `unsafe` kernel,
            /// its contract must hold (see `HostEntry`).
            #[allow(unused_variables)]
            unsafe fn __host_entry(
                params: *const *const ::core::ffi::c_void,
            ) -> ::core::result::Result<(), ::oxccl_device::DeviceError> {
                #(
                    // SAFETY: the caller passes one valid, aligned pointer per parameter;
                    // parameter types are `Copy`, so reading leaves the source valid. Only
                    // lifetimes differ from the launch's types, and they are erased.
                    let #reads: #static_tys = unsafe {
                        ::core::ptr::read((*params.add(#indices)).cast::<#static_tys>())
                    };
                )*
                ::oxccl_device::kernel_return::KernelReturn::into_result(#host_call)
            }

            #[doc = #launch_doc]
            // The launcher and the configuration come on top of the kernel's own parameters.
            #[allow(unused_variables, clippy::too_many_arguments)]
            pub #launch_unsafety fn launch<#(#lifetimes,)* L: ::oxccl_device::launch::Launcher + ?Sized>(
                launcher: &L,
                config: ::oxccl_device::launch::LaunchConfig,
                #(#idents: #tys),*
            ) -> ::core::result::Result<(), L::Error> {
                let params: [*const ::core::ffi::c_void; #count] = [
                    #( (&#idents as *const #tys).cast::<::core::ffi::c_void>() ),*
                ];
                // SAFETY: `params` holds exactly one pointer per parameter of `KERNEL`, in
                // order, each to a live value of that parameter's type (the arguments
                // outlive the call, and the launcher copies the values before returning); an
                // `unsafe` kernel's own contract is this function's caller's to uphold.
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
    if let Some(abi) = &sig.abi {
        push(syn::Error::new(
            abi.span(),
            "a kernel cannot declare an ABI: `#[kernel]` chooses it per target",
        ));
    }
    for param in &sig.generics.params {
        if !matches!(param, syn::GenericParam::Lifetime(_)) {
            push(syn::Error::new(
                param.span(),
                "a kernel cannot be generic over types or constants: a PTX entry point has \
                 one fixed parameter list (lifetimes of handle parameters are fine)",
            ));
        }
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
        let result = matches!(&**ty, Type::Path(p)
            if p.path.segments.last().is_some_and(|s| s.ident == "Result"));
        if !unit && !result {
            push(syn::Error::new(
                ty.span(),
                "a kernel returns nothing or `Result<(), DeviceError>`: write results to \
                 device memory instead",
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
                if let Some(ident) = &ident
                    && (ident == "launcher" || ident == "config")
                {
                    push(syn::Error::new(
                        ident.span(),
                        format!(
                            "a kernel parameter cannot be named `{ident}`: the generated \
                             `launch(launcher, config, ..)` takes the launcher and the launch \
                             configuration under these names before the kernel's parameters"
                        ),
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
