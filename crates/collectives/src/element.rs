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
}

macro_rules! element {
    ($t:ty, $d:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
        }
    };
}

element!(f32, DType::F32);
element!(f64, DType::F64);
element!(f16, DType::F16);
element!(bf16, DType::Bf16);
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
}
