"""This machine against a line: the toolchain fingerprint, where the line's environment is, the checks that
refuse or warn.
"""
