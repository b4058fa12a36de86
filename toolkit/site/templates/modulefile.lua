-- -*- lua -*-
-- ${module}: Lmod modulefile written by fa-envkit (`toolkit modules`) from ${spec}.
-- Generated: edit the spec or the template (toolkit/site/templates/modulefile.lua) and regenerate.

${whatis}

help([[
${help}
]])

-- One flash-attn at a time: loading another replaces this one (with LMOD_AUTO_SWAP=no, one of another name fails).
${statements}
