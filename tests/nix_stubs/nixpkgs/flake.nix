{
  description = "Stand-in for nixpkgs in fa-envkit's offline tests (see default.nix)";
  # flake.nix does `import nixpkgs { ... }`, which reads default.nix; the stub needs no outputs.
  outputs = { self }: { };
}
