//! Element types: the sealed [`Element`] trait, one macro line per type.

use half::{bf16, f16};
use relaycc_route::DType;

mod sealed {
    /// Only the ten element types of [`relaycc_route::DType`] may be elements.
    pub trait Sealed {}
}

/// A type that collectives can move and reduce: one of `f32`, `f64`, [`f16`](struct@half::f16), [`bf16`], `i8`,
/// `u8`, `i32`, `u32`, `i64`, `u64`.
///
/// The trait is sealed: its set of types is the set of [`DType`]s the planner and the backends
/// know. It builds on [`bytemuck::Pod`] (any bit pattern is a value, no padding), which is
/// what lets a backend move elements as bytes; every one of these types also implements
/// cudarc's `DeviceRepr`, so a typed cudarc buffer can hold them.
pub trait Element:
    sealed::Sealed + bytemuck::Pod + Send + Sync + PartialEq + std::fmt::Debug + 'static
{
    /// The element type as plans name it.
    const DTYPE: DType;
    /// The integer `v` as this type: wrapped for integer types (as `as` wraps, matching the
    /// wrap-around arithmetic of integer reductions), rounded to nearest for floating types.
    /// Tests and benchmarks fill buffers with it so that expected results are exact.
    fn from_i64(v: i64) -> Self;
    /// The value as `f64`: exact for every floating type and for integers within 2^53.
    fn to_f64(self) -> f64;
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        element!($t, $d, v => v as $t, x => x as f64);
    };
    // The half-precision types convert through `f64` (`half` has no `as`).
    ($t:ty, $d:expr, $v:ident => $from:expr, $x:ident => $to:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            fn from_i64($v: i64) -> Self {
                $from
            }
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
        }
    };
}

element!(f32, DType::F32);
element!(f64, DType::F64);
element!(f16, DType::F16, v => f16::from_f64(v as f64), x => f64::from(x));
element!(bf16, DType::Bf16, v => bf16::from_f64(v as f64), x => f64::from(x));
element!(i8, DType::I8);
element!(u8, DType::U8);
element!(i32, DType::I32);
element!(u32, DType::U32);
element!(i64, DType::I64);
element!(u64, DType::U64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_dtypes() {
        fn size<T: Element>() -> (u64, u64) {
            (std::mem::size_of::<T>() as u64, T::DTYPE.size())
        }
        for (a, b) in [
            size::<f32>(),
            size::<f64>(),
            size::<f16>(),
            size::<bf16>(),
            size::<i8>(),
            size::<u8>(),
            size::<i32>(),
            size::<u32>(),
            size::<i64>(),
            size::<u64>(),
        ] {
            assert_eq!(a, b);
        }
    }

    #[test]
    fn integers_wrap_and_floats_round_through_f64() {
        assert_eq!(u8::from_i64(-1), 255);
        assert_eq!(i8::from_i64(130), -126);
        assert_eq!(u64::from_i64(-1).to_f64(), u64::MAX as f64);
        assert_eq!(f16::from_i64(-7).to_f64(), -7.0);
        assert_eq!(
            bf16::from_i64(257).to_f64(),
            256.0,
            "bf16 keeps 8 mantissa bits"
        );
        assert_eq!(f32::from_i64(3).to_f64(), 3.0);
        assert_eq!(f64::from_i64(1 << 53).to_f64(), 9007199254740992.0);
    }
}
