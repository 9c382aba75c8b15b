//! What a registration's client process number says (docs/design.md §10): whether a
//! registration replaces one of the same process ([`is_same_process`]).

/// Whether a registration sent by client process `sent` replaces one that the same process
/// sent (`stored`; 0: unknown): a reconnect, not a new incarnation (docs/design.md §10). A
/// process that sent no number is never taken for the same one.
pub fn is_same_process(sent: u64, stored: u64) -> bool {
    sent != 0 && sent == stored
}
