//! [`forward_server!`]: the [`ClickHouseServer`](crate::ClickHouseServer) implementation of a
//! wrapper around another server ([`Retrying`](crate::retry::Retrying), `Faulty`), whose methods
//! mostly forward to `self.inner` through one method of the wrapper. Each wrapper lists the
//! trait's methods once, with what its wrapping method needs (a name, and for `Faulty` the
//! detail it records), and writes out only the methods that do something else.

/// Implements `ClickHouseServer` for `$wrapper`, a struct with a field `inner: SharedServer`.
///
/// Every method under `forward`, listed as `fn name(&self, args) -> T = $name $(, $detail)?;`
/// (for the trait's `-> Result<T, ServerError>`), becomes
/// `self.$via($name, $($detail,)? || self.inner.name(args)).await`: `$via` receives a closure
/// that starts the call afresh each time it is called. The items under `by_hand` are copied
/// into the impl as they are (`endpoint`, and methods that are no plain forward).
macro_rules! forward_server {
    (
        impl ClickHouseServer for $wrapper:ty;
        by_hand { $($by_hand:tt)* }
        forward via $via:ident {
            $(
                fn $method:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty
                    = $name:literal $(, $detail:expr)?;
            )*
        }
    ) => {
        #[async_trait::async_trait]
        impl $crate::ClickHouseServer for $wrapper {
            $($by_hand)*

            $(
                async fn $method(&self $(, $arg: $ty)*) -> Result<$ret, $crate::ServerError> {
                    self.$via($name, $($detail,)? || self.inner.$method($($arg),*))
                        .await
                }
            )*
        }
    };
}
