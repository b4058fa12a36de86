#%Module1.0
# flash-attn/2.8.3.post2-cu130-torch2.11-py<XY>: Tcl modulefile (Environment Modules) written by fa-envkit (`toolkit modules`) from /PROJECT/envs/site.yaml.
# Generated: edit the spec or the template (toolkit/site/templates/modulefile.tcl) and regenerate.

module-whatis "Name: flash-attn"
module-whatis "Version: 2.8.3.post2-cu130-torch2.11-py<XY>"
module-whatis "Description: FlashAttention 2.8.3.post2+cu130torch2.11 for CUDA 13.0 (cu130), torch 2.11.0+cu130, python <X.Y>"
module-whatis "URL: https://github.com/Dao-AILab/flash-attention"

proc ModulesHelp {} {
    puts stderr "flash-attn/2.8.3.post2-cu130-torch2.11-py<XY>: FlashAttention (flash-attn 2.8.3.post2+cu130torch2.11) from line site."
    puts stderr "Site GPU nodes (CUDA 13.0 module, torch in a venv)"
    puts stderr ""
    puts stderr "Inside:"
    puts stderr "  flash-attn  2.8.3.post2+cu130torch2.11"
    puts stderr "  torch       2.11.0+cu130"
    puts stderr "  CUDA        13.0"
    puts stderr "  python      <X.Y.Z>"
    puts stderr ""
    puts stderr "Environment:  /PROJECT/site-venv (external toolchain, installed with /PROJECT/site-venv/bin/python)"
    puts stderr "Installed in: /PROJECT/site-venv/lib/python<X.Y>/site-packages"
    puts stderr "Spec:         /PROJECT/envs/site.yaml"
    puts stderr "              input sha256 <site.yaml input sha256>"
    puts stderr "Lock:         none (no /PROJECT/locks/site.conda-lock.yml when this module was written)"
    puts stderr "Build:        no record in /PROJECT/wheelhouse/site of building flash-attn 2.8.3.post2+cu130torch2.11"
    puts stderr "Requires:     cuda/13.0 (loaded with this module)"
    puts stderr "Sets:         PATH FLASH_ATTN_ROOT CUDA_HOME VIRTUAL_ENV"
}

# One flash-attn at a time: Environment Modules refuses to load a second one.
# Lmod users: use the Lua tree (Lmod 8.6 does not restore a Tcl pushenv on unload, TACC/Lmod#584).
family flash_attn
depends-on "cuda/13.0"
prepend-path PATH "/PROJECT/site-venv/bin"
pushenv FLASH_ATTN_ROOT "/PROJECT/site-venv"
pushenv CUDA_HOME "/PROJECT/site-cuda"
pushenv VIRTUAL_ENV "/PROJECT/site-venv"
