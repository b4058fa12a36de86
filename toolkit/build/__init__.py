"""flash-attn built from its sdist against a line's toolchain: sizing, the ninja shim, the record, the
wheelhouse, the diagnosis.
"""
