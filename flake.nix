{
  description = "fa-envkit: a dev shell per CUDA line in envs/ (nixpkgs' nvcc, cudart and CUDA headers, the spec's gcc and python, ninja, micromamba, the toolkit)";

  # A release branch, not a revision: the first `nix develop` writes flake.lock; commit it. Which lines
  # this nixpkgs can provide is decided while evaluating, from what the locked revision has (notProvided).
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";

  outputs = { self, nixpkgs }:
    let
      inherit (builtins)
        all attrNames attrValues compareVersions concatMap concatStringsSep elem elemAt filter foldl'
        isList isString listToAttrs mapAttrs match readDir readFile replaceStrings split substring
        stringLength tryEval;

      # ---------------------------------------------------------------- the lines, read from envs/

      # envs/*.yaml is the one list of lines. Nix has no YAML parser, so this reads the subset the specs
      # use for the fields a shell needs: `key: value` lines, one nested level as "parent.key", flow
      # lists. tests/test_flake.py proves it agrees with toolkit.spec.envspec.load_spec on every spec.
      envsDir = ./envs;

      # One scalar written on one line: drop a trailing comment, surrounding blanks and quotes.
      scalar = raw:
        let
          uncommented =
            if match "[ ]*#.*" raw != null then ""
            else let m = match "(.*[^ ])[ ]+#.*" raw; in if m == null then raw else elemAt m 0;
          trimmed = let m = match "[ ]*(.*[^ ])[ ]*" uncommented; in if m == null then "" else elemAt m 0;
          quoted = match "\"(.*)\"|'(.*)'" trimmed;
        in
        if quoted == null then trimmed
        else if elemAt quoted 0 != null then elemAt quoted 0
        else elemAt quoted 1;

      flowList = value:
        let m = match "\\[(.*)]" value; in
        if m == null then null
        else filter (item: item != "") (map scalar (filter isString (split "," (elemAt m 0))));

      # The fields one file sets itself, as { "cuda" = "12.6"; "toolchain.kind" = "locked"; ... }.
      readSpecFile = path:
        let
          step = acc: text:
            let
              top = match "([A-Za-z_][A-Za-z0-9_]*):(.*)" text;
              nested = match "  ([A-Za-z_][A-Za-z0-9_]*):(.*)" text;
              # An empty value (a mapping or a block list follows) is kept as "": it still overrides
              # the parent's value, and `need` refuses it rather than reading the parent's.
              set = key: raw: acc.fields // { ${key} = scalar raw; };
            in
            if top != null then { parent = elemAt top 0; fields = set (elemAt top 0) (elemAt top 1); }
            else if nested != null then acc // { fields = set "${acc.parent}.${elemAt nested 0}" (elemAt nested 1); }
            else acc;
        in
        (foldl' step { parent = ""; fields = { }; } (filter isString (split "\n" (readFile path)))).fields;

      # Child over parent along `extends`, as the toolkit merges (for the scalar fields read here).
      specFields = name:
        let own = readSpecFile (envsDir + "/${name}.yaml"); in
        (if own ? extends then specFields own.extends else { }) // own;

      lineFacts = name:
        let
          fields = specFields name;
          need = field:
            if (fields.${field} or "") != "" then fields.${field}
            else throw "envs/${name}.yaml: ${field}: not set in a form flake.nix reads, here or in the specs it extends (write it as in envs/base.yaml: `key: value` on one line, nested keys indented two spaces, lists as [a, b])";
          platforms = flowList (need "platforms");
        in
        {
          cuda = need "cuda";
          gcc = need "gcc";
          python = need "python";
          kind = need "toolchain.kind";
          platforms =
            if platforms == null
            then throw "envs/${name}.yaml: platforms: flake.nix reads only a one-line list (write it as [linux-64, linux-aarch64])"
            else platforms;
        };

      lineNames = map (file: substring 0 (stringLength file - 5) file)
        (filter (file: match ".*\\.yaml" file != null && file != "base.yaml") (attrNames (readDir envsDir)));

      lines = listToAttrs (map (name: { inherit name; value = lineFacts name; }) lineNames);

      # ---------------------------------------------------------------- nixpkgs, per platform

      # The specs' platform names and the Nix systems they run on.
      systemOf = { "linux-64" = "x86_64-linux"; "linux-aarch64" = "aarch64-linux"; };

      # Unfree is allowed for NVIDIA's CUDA EULA only: the predicate from the nixpkgs manual
      # ("Configuring Nixpkgs for CUDA"), narrowed to the CUDA toolkit's license. Nothing else here
      # needs cudaSupport: torch comes from the line's pip lock, not from nixpkgs.
      allowUnfreePredicate = pkg:
        let license = pkg.meta.license or [ ]; in
        all (l: (l.free or false) || (l.shortName or "") == "CUDA EULA") (if isList license then license else [ license ]);

      pkgsFor = system: import nixpkgs { inherit system; config = { inherit allowUnfreePredicate; }; };

      # The nixpkgs attributes a line's shell is made of, named as nixpkgs names them.
      attrsOf = line: {
        cudaPackages = "cudaPackages_" + replaceStrings [ "." ] [ "_" ] line.cuda;
        gcc = "gcc" + line.gcc;
        python = "python" + replaceStrings [ "." ] [ "" ] line.python;
      };

      # Removed attributes stay in nixpkgs as `throw` aliases (pkgs/top-level/aliases.nix), hence tryEval.
      usable = pkgs: attr: pkgs ? ${attr} && (tryEval pkgs.${attr}).success;

      # Why nixpkgs cannot provide a line on a platform, or null when it can.
      whyNot = platform: pkgs: name: line:
        let missing = filter (attr: !usable pkgs attr) (attrValues (attrsOf line)); in
        if line.kind == "external" then
          "envs/${name}.yaml has toolchain.kind external: its toolchain is a machine image or site module, not something nixpkgs builds"
        else if line.kind == "pypi" then
          "envs/${name}.yaml has toolchain.kind pypi: its toolchain is NVIDIA's wheels in a venv (toolkit install ${name}), not nixpkgs' CUDA"
        else if !elem platform line.platforms then
          "envs/${name}.yaml does not list platform ${platform}"
        else if missing != [ ] then
          "nixpkgs ${nixpkgs.shortRev or "(a path input, no revision)"} has no usable ${concatStringsSep ", " missing}"
        else null;

      # ---------------------------------------------------------------- shells

      # The toolkit with its exact pins (pyproject.toml) in a venv of the shell's python: nixpkgs does
      # not carry py-rattler or conda-lock at those versions. The venv is rebuilt when pyproject.toml
      # changes; its stamp is written last, so an interrupted install is redone from scratch.
      venvFunction = python: ''
        fa_envkit_venv() {
          if [ ! -f pyproject.toml ] || [ ! -d envs ]; then
            echo "fa-envkit: $PWD is not the project root (no pyproject.toml and envs/ here); cd there and retry" >&2
            return 1
          fi
          local venv=".cache/nix-venv/${baseNameOf "${python}"}"
          local stamp
          stamp="$(${python}/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
          if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp" ]; then
            echo "fa-envkit: installing the toolkit and its pinned dependencies into $venv (needs PyPI)" >&2
            rm -rf "$venv"
            if ! { ${python}/bin/python -m venv "$venv" &&
                   "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'; }; then
              echo "fa-envkit: installing into $venv failed; fix the cause above and try again" >&2
              return 1
            fi
            echo "$stamp" > "$venv/.installed"
          fi
          . "$venv/bin/activate"
        }
      '';

      toolkitShell = pkgs: { name, python, stdenv ? pkgs.stdenv, extraPackages ? [ ], variables ? { }, extraHook ? "" }:
        (pkgs.mkShell.override { inherit stdenv; }) (variables // {
          inherit name;
          packages = [ python pkgs.ninja pkgs.micromamba ] ++ extraPackages;
          shellHook = extraHook + venvFunction python + ''
            fa_envkit_venv || echo "fa-envkit: the toolkit is not installed in this shell (see above)" >&2
          '';
        });

      # Every output of a package but the static archives, as nixpkgs' cudatoolkit wrapper joins them.
      allOutputs = p: map (output: p.${output}) (filter (output: output != "static") (p.outputs or [ "out" ]));

      lineShell = pkgs: name: line:
        let
          attrs = attrsOf line;
          cuda = pkgs.${attrs.cudaPackages};
          python = pkgs.${attrs.python};
          hostStdenv = pkgs.overrideCC pkgs.stdenv pkgs.${attrs.gcc};
          cc = hostStdenv.cc;
          # nvcc, the runtime and the CUDA headers (cccl: thrust, cub, libcu++; crt left nvcc in CUDA 13).
          components = [ "cuda_nvcc" "cuda_cudart" "cuda_cccl" ]
            ++ (if compareVersions line.cuda "13" >= 0 then [ "cuda_crt" ] else [ ]);
          cudaHome = pkgs.symlinkJoin {
            name = "cuda-home-${cuda.cudaMajorMinorVersion}";
            paths = concatMap (component: allOutputs cuda.${component}) components;
          };
        in
        toolkitShell pkgs {
          name = "fa-envkit-${name}";
          inherit python;
          stdenv = hostStdenv;
          extraPackages = [ cuda.cuda_nvcc ];
          variables.CUDA_HOME = cudaHome;
          # nixpkgs' nvcc defaults to its own newest supported gcc (nvcc.profile compiler-bindir); the
          # spec's gcc wins through NVCC_CCBIN, and torch passes `-ccbin $CC`, so both are absolute.
          extraHook = ''
            export CC=${cc}/bin/gcc CXX=${cc}/bin/g++ NVCC_CCBIN=${cc}/bin/g++
            echo "fa-envkit ${name}: CUDA ${cuda.cudaMajorMinorVersion} (CUDA_HOME=$CUDA_HOME), gcc ${line.gcc}, python ${line.python}" >&2
          '';
        };

      checkApp = pkgs: pkgs.writeShellScriptBin "toolkit-check" ''
        ${venvFunction pkgs.python3}
        fa_envkit_venv || exit 1
        exec toolkit check "$@"
      '';

      # Everything that depends on the platform, with nixpkgs imported once per system.
      perSystem = listToAttrs (map
        (platform:
          let
            pkgs = pkgsFor systemOf.${platform};
            why = mapAttrs (whyNot platform pkgs) lines;
            pick = keep: listToAttrs (map (name: { inherit name; value = why.${name}; }) (filter keep lineNames));
          in
          {
            name = systemOf.${platform};
            value = {
              devShells = { default = toolkitShell pkgs { name = "fa-envkit"; python = pkgs.python3; }; }
                // mapAttrs (name: _: lineShell pkgs name lines.${name}) (pick (name: why.${name} == null));
              # Lines without a shell on this system, each with the reason: nothing is silently missing.
              notProvided = pick (name: why.${name} != null);
              # `nix run .#check`: `toolkit check` on the specs in the current directory.
              apps.check = { type = "app"; program = "${checkApp pkgs}/bin/toolkit-check"; };
            };
          })
        (attrNames systemOf));
    in
    {
      devShells = mapAttrs (_: outputs: outputs.devShells) perSystem;
      notProvided = mapAttrs (_: outputs: outputs.notProvided) perSystem;
      apps = mapAttrs (_: outputs: outputs.apps) perSystem;
      lib = { inherit lines allowUnfreePredicate; };
    };
}
