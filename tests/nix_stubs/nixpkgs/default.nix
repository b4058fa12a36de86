# A stand-in for nixpkgs, used only by tests/test_flake.py: these machines cannot fetch nixpkgs, so the
# flake's inputs are overridden with this. It has the attribute names and shapes ../../../flake.nix uses,
# with trivial derivations instead of packages, and acts like nixpkgs where the flake's logic depends
# on it: removed attributes throw (as pkgs/top-level/aliases.nix does), and unfree packages are refused
# unless config.allowUnfreePredicate accepts them (as pkgs/stdenv/generic/check-meta.nix does).
# available.json lists which attributes exist; tests rewrite it to play other nixpkgs revisions.
{ system, config ? { } }:
let
  inherit (builtins) compareVersions elemAt fromJSON listToAttrs map match readFile;

  available = fromJSON (readFile ./available.json);

  # A derivation that really builds, with the host's tools (Debian's nix runs without a sandbox):
  # every output is a stub file unless args say otherwise.
  stub = name: args: derivation ({
    inherit name system;
    PATH = "/usr/bin:/bin";
    builder = "/bin/sh";
    args = [ "-c" "for o in \${outputs:-out}; do eval \"echo stub > \\$$o\"; done" ];
  } // args);

  cudaEula = pkg:
    let licensed = pkg // { meta.license = { shortName = "CUDA EULA"; free = false; }; }; in
    if (config.allowUnfreePredicate or (_: false)) licensed then licensed
    else throw "stub nixpkgs: ${pkg.name} has an unfree license (CUDA EULA) that config.allowUnfreePredicate refuses";

  cudaPackages = version: {
    cudaMajorMinorVersion = version;
    cuda_nvcc = cudaEula (stub "cuda_nvcc-${version}" { });
    cuda_cudart = cudaEula (stub "cuda_cudart-${version}" { outputs = [ "out" "lib" "dev" "static" ]; });
    cuda_cccl = cudaEula (stub "cuda_cccl-${version}" { });
  } // (if compareVersions version "13" >= 0 then { cuda_crt = cudaEula (stub "cuda_crt-${version}" { }); } else { });

  package = name:
    let
      cuda = match "cudaPackages_([0-9]+)_([0-9]+)" name;
      gcc = match "gcc([0-9]+)" name;
      python = match "python[0-9]*" name;
    in
    if cuda != null then cudaPackages "${elemAt cuda 0}.${elemAt cuda 1}"
    else if gcc != null then stub "gcc-wrapper-${elemAt gcc 0}.stub" { }
    else if python != null && available.host_python != null then hostPython name
    else stub "${name}.stub" { };

  # pythonXY as the host's interpreter, when a test needs shell scripts that really run python.
  hostPython = name: stub "${name}.stub" { args = [ "-c" "mkdir -p $out/bin && ln -s ${available.host_python} $out/bin/python" ]; };

  stdenv = { cc = stub "gcc-wrapper-default.stub" { }; };

  shellWith = stdenv: attrs: stub (attrs.name or "nix-shell") (removeAttrs attrs [ "name" ] // { stdenvCc = stdenv.cc; });
in
listToAttrs (map (name: { inherit name; value = package name; }) available.present)
// listToAttrs (map (name: { inherit name; value = throw "${name} has been removed from Nixpkgs (stub)"; }) available.removed)
// {
  inherit stdenv;
  overrideCC = stdenv: cc: stdenv // { inherit cc; };
  mkShell = { __functor = _: shellWith stdenv; override = args: shellWith args.stdenv; };
  symlinkJoin = { name, paths }: stub name { inherit paths; };
  writeShellScriptBin = name: text: stub name {
    inherit text;
    args = [ "-c" "mkdir -p $out/bin && echo '#!/bin/bash' > $out/bin/${name} && printf '%s\n' \"$text\" >> $out/bin/${name} && chmod +x $out/bin/${name}" ];
  };
}
