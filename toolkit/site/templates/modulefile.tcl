#%Module1.0
# ${module}: Tcl modulefile (Environment Modules) written by fa-envkit (`toolkit modules`) from ${spec}.
# Generated: edit the spec or the template (toolkit/site/templates/modulefile.tcl) and regenerate.

${whatis}

proc ModulesHelp {} {
${help}
}

# One flash-attn at a time: Environment Modules refuses to load a second one.
# Lmod users: use the Lua tree (Lmod 8.6 does not restore a Tcl pushenv on unload, TACC/Lmod#584).
${statements}
