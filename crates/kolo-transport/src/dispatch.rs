//! From a runtime [`kolo_protocol::DataType`] to a static [`crate::Element`] type.

/// Runs `$body` with `$T` bound (as a type alias) to the [`crate::Element`]
/// type named by the runtime [`kolo_protocol::DataType`] `$dtype`, and
/// evaluates to the body's value. Every arm is compiled, so the body must
/// type-check for all eleven types.
///
/// ```
/// use kolo_protocol::DataType;
/// use kolo_transport::{with_element_type, Element};
///
/// fn bytes_per_element(dtype: DataType) -> usize {
///     with_element_type!(dtype, T => std::mem::size_of::<T>())
/// }
/// assert_eq!(bytes_per_element(DataType::BF16), 2);
///
/// // A kernel picked at run time, e.g. by the engine for a fused buffer.
/// let name = with_element_type!(DataType::I64, T => T::DTYPE.name());
/// assert_eq!(name, "i64");
/// ```
#[macro_export]
macro_rules! with_element_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::__private::DataType::U8 => {
                type $T = u8;
                $body
            }
            $crate::__private::DataType::I8 => {
                type $T = i8;
                $body
            }
            $crate::__private::DataType::U16 => {
                type $T = u16;
                $body
            }
            $crate::__private::DataType::I16 => {
                type $T = i16;
                $body
            }
            $crate::__private::DataType::I32 => {
                type $T = i32;
                $body
            }
            $crate::__private::DataType::I64 => {
                type $T = i64;
                $body
            }
            $crate::__private::DataType::F16 => {
                type $T = $crate::__private::f16;
                $body
            }
            $crate::__private::DataType::BF16 => {
                type $T = $crate::__private::bf16;
                $body
            }
            $crate::__private::DataType::F32 => {
                type $T = f32;
                $body
            }
            $crate::__private::DataType::F64 => {
                type $T = f64;
                $body
            }
            $crate::__private::DataType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use crate::Element;
    use kolo_protocol::DataType;

    #[test]
    fn every_dtype_maps_to_its_element() {
        for dtype in DataType::ALL {
            let (named, size) =
                with_element_type!(dtype, T => (T::DTYPE, std::mem::size_of::<T>()));
            assert_eq!(named, dtype);
            assert_eq!(size, dtype.size());
        }
    }
}
