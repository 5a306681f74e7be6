//! Data types and reduction operations of collectives: the ids host and device agree on,
//! and the arithmetic.
//!
//! A collective kernel takes its element type and its operation as [`DataType`] and
//! [`ReduceOp`] ids (kernels cannot be generic: a PTX entry point has one parameter list)
//! and dispatches once, outside its loops, to code generic over [`ReduceElement`] with
//! [`dispatch_element!`](crate::dispatch_element).
//!
//! The operations are NCCL's:
//!
//! | op | integers | floating point |
//! |---|---|---|
//! | `Sum` | wrapping sum | sum |
//! | `Prod` | wrapping product | product |
//! | `Min`, `Max` | | IEEE `minNum`/`maxNum`: a NaN loses to a number |
//! | `Avg` | sum, then divided by the number of ranks (rounding toward zero) | sum, then divided by the number of ranks |
//!
//! `f16` and `bf16` ([`half::f16`], [`half::bf16`]) are combined in `f32` and rounded back
//! after every step, as NCCL does for them. Sums of floating-point values depend on the order
//! of the additions: two algorithms may differ in the last bits, and a test compares them
//! with a tolerance.

pub use crate::device_view::Element;
pub use half::{bf16, f16};

/// The element type of a collective's buffers.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`.
    F32 = 0,
    /// `f64`.
    F64 = 1,
    /// IEEE half precision ([`half::f16`]).
    F16 = 2,
    /// bfloat16 ([`half::bf16`]).
    Bf16 = 3,
    /// `i8`.
    I8 = 4,
    /// `u8`.
    U8 = 5,
    /// `i32`.
    I32 = 6,
    /// `u32`.
    U32 = 7,
    /// `i64`.
    I64 = 8,
    /// `u64`.
    U64 = 9,
}

impl DataType {
    /// Every type, in id order.
    pub const ALL: [DataType; 10] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::Bf16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// The type with id `id`, if there is one.
    pub const fn from_id(id: u32) -> Option<DataType> {
        if (id as usize) < Self::ALL.len() {
            Some(Self::ALL[id as usize])
        } else {
            None
        }
    }

    /// Bytes of one element.
    pub const fn size(self) -> u64 {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    /// The name NCCL's tests print (`float`, `half`, `bfloat16`, `int8`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
        }
    }

    /// Whether values are floating point.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
        )
    }
}

/// The reduction a collective applies.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum = 0,
    /// Product.
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Sum divided by the number of ranks.
    Avg = 4,
}

impl ReduceOp {
    /// Every operation, in id order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The operation with id `id`, if there is one.
    pub const fn from_id(id: u32) -> Option<ReduceOp> {
        if (id as usize) < Self::ALL.len() {
            Some(Self::ALL[id as usize])
        } else {
            None
        }
    }

    /// The name NCCL's tests print (`sum`, `prod`, `min`, `max`, `avg`).
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A type collectives move and reduce: a view [`Element`] with a [`DataType`] id and the
/// reduction operations. Implemented for the ten types of [`DataType`] only.
pub trait ReduceElement: Element + 'static + sealed::Sealed {
    /// Its id.
    const TYPE: DataType;

    /// `self` combined with `other` by `op` (`Avg` combines as `Sum`).
    fn combine(self, other: Self, op: ReduceOp) -> Self;

    /// The final value of a reduction over `ranks` ranks: `self` for every op but `Avg`,
    /// which divides.
    fn finish(self, op: ReduceOp, ranks: u32) -> Self;

    /// The element as `f64`, for comparing results with a tolerance.
    fn to_f64(self) -> f64;

    /// A value from `f64` (rounded, saturated for integers), for building test inputs.
    fn from_f64(v: f64) -> Self;
}

macro_rules! float_element {
    ($t:ty, $id:expr) => {
        impl sealed::Sealed for $t {}
        impl ReduceElement for $t {
            const TYPE: DataType = $id;
            #[inline(always)]
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => self + other,
                    ReduceOp::Prod => self * other,
                    ReduceOp::Min => self.min(other),
                    ReduceOp::Max => self.max(other),
                }
            }
            #[inline(always)]
            fn finish(self, op: ReduceOp, ranks: u32) -> Self {
                match op {
                    ReduceOp::Avg => self / ranks as $t,
                    _ => self,
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

macro_rules! half_element {
    ($t:ty, $id:expr) => {
        impl sealed::Sealed for $t {}
        impl ReduceElement for $t {
            const TYPE: DataType = $id;
            #[inline(always)]
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                <$t>::from_f32(self.to_f32().combine(other.to_f32(), op))
            }
            #[inline(always)]
            fn finish(self, op: ReduceOp, ranks: u32) -> Self {
                <$t>::from_f32(self.to_f32().finish(op, ranks))
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}

macro_rules! int_element {
    ($t:ty, $id:expr) => {
        impl sealed::Sealed for $t {}
        impl ReduceElement for $t {
            const TYPE: DataType = $id;
            #[inline(always)]
            fn combine(self, other: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => self.wrapping_add(other),
                    ReduceOp::Prod => self.wrapping_mul(other),
                    ReduceOp::Min => {
                        if other < self {
                            other
                        } else {
                            self
                        }
                    }
                    ReduceOp::Max => {
                        if other > self {
                            other
                        } else {
                            self
                        }
                    }
                }
            }
            #[inline(always)]
            fn finish(self, op: ReduceOp, ranks: u32) -> Self {
                match op {
                    // A rank count that does not fit the type (300 ranks of i8) leaves the
                    // sum as it is rather than dividing by a wrapped count.
                    ReduceOp::Avg => match <$t>::try_from(ranks) {
                        Ok(n) if n > 0 => self / n,
                        _ => self,
                    },
                    _ => self,
                }
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

float_element!(f32, DataType::F32);
float_element!(f64, DataType::F64);
half_element!(f16, DataType::F16);
half_element!(bf16, DataType::Bf16);
int_element!(i8, DataType::I8);
int_element!(u8, DataType::U8);
int_element!(i32, DataType::I32);
int_element!(u32, DataType::U32);
int_element!(i64, DataType::I64);
int_element!(u64, DataType::U64);

/// Runs `$body` with `$t` bound to the Rust type of the [`DataType`] `$dtype`: one branch per
/// type, taken once, outside the loops that `$body` runs.
///
/// ```
/// use oxccl_device::dispatch_element;
/// use oxccl_device::reduce::DataType;
///
/// fn size_of(dtype: DataType) -> usize {
///     dispatch_element!(dtype, T => core::mem::size_of::<T>())
/// }
/// assert_eq!(size_of(DataType::Bf16), 2);
/// assert_eq!(size_of(DataType::U64), 8);
/// ```
#[macro_export]
macro_rules! dispatch_element {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::reduce::DataType::F32 => {
                type $t = f32;
                $body
            }
            $crate::reduce::DataType::F64 => {
                type $t = f64;
                $body
            }
            $crate::reduce::DataType::F16 => {
                type $t = $crate::reduce::f16;
                $body
            }
            $crate::reduce::DataType::Bf16 => {
                type $t = $crate::reduce::bf16;
                $body
            }
            $crate::reduce::DataType::I8 => {
                type $t = i8;
                $body
            }
            $crate::reduce::DataType::U8 => {
                type $t = u8;
                $body
            }
            $crate::reduce::DataType::I32 => {
                type $t = i32;
                $body
            }
            $crate::reduce::DataType::U32 => {
                type $t = u32;
                $body
            }
            $crate::reduce::DataType::I64 => {
                type $t = i64;
                $body
            }
            $crate::reduce::DataType::U64 => {
                type $t = u64;
                $body
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against an id that does not round-trip, a wrong size, or the two enums
    /// drifting from their `ALL` lists.
    #[test]
    fn ids_round_trip() {
        for (i, t) in DataType::ALL.iter().enumerate() {
            assert_eq!(*t as u32, i as u32);
            assert_eq!(DataType::from_id(i as u32), Some(*t));
            assert_eq!(
                t.size(),
                dispatch_element!(*t, T => core::mem::size_of::<T>()) as u64
            );
            assert_eq!(dispatch_element!(*t, T => T::TYPE), *t);
        }
        assert_eq!(DataType::from_id(10), None);
        for (i, op) in ReduceOp::ALL.iter().enumerate() {
            assert_eq!(*op as u32, i as u32);
            assert_eq!(ReduceOp::from_id(i as u32), Some(*op));
        }
        assert_eq!(ReduceOp::from_id(5), None);
    }

    /// Guards against an operation computing something else than NCCL's: integer sums
    /// wrap, averages divide at the end, min and max pick the right side, halves round
    /// through f32.
    #[test]
    fn operations_compute_what_nccl_does() {
        use ReduceOp::*;
        assert_eq!(250u8.combine(10, Sum), 4);
        assert_eq!(100i8.combine(3, Prod), 44);
        assert_eq!((-3i32).combine(2, Min), -3);
        assert_eq!(7u64.combine(9, Max), 9);
        assert_eq!(7i32.combine(8, Avg).finish(Avg, 2), 7);
        assert_eq!((-7i32).finish(Avg, 2), -3, "rounds toward zero");
        assert_eq!(1.5f32.combine(2.5, Avg).finish(Avg, 2), 2.0);
        assert_eq!(f32::NAN.combine(1.0, Min), 1.0);
        assert_eq!(2.0f64.combine(-1.0, Max), 2.0);
        let h = f16::from_f32(1.5).combine(f16::from_f32(0.25), Sum);
        assert_eq!(h.to_f32(), 1.75);
        let b = bf16::from_f32(3.0).combine(bf16::from_f32(2.0), Prod);
        assert_eq!(b.to_f32(), 6.0);
        assert_eq!(
            5u8.finish(Avg, 300),
            5,
            "a count that does not fit: no division"
        );
    }
}
