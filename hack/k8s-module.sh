# Sourced by hack/control-plane.sh and hack/cluster.sh: the wrapper Go module that builds
# upstream Kubernetes mains from the published k8s.io/kubernetes module.
#
# k8s.io/kubernetes pins its staging modules (k8s.io/api, k8s.io/apiserver, ...) as v0.0.0 with
# ./staging replace lines, which do not resolve outside its own tree; the wrapper replaces each
# with the published v0.<minor>.<patch>.

# k8s_wrapper_module DIR MODULE K8S_VERSION: writes DIR/go.mod for module MODULE requiring
# k8s.io/kubernetes@K8S_VERSION (downloaded into the Go module cache if needed).
k8s_wrapper_module() {
  local dir=$1 module=$2 version=$3 gomod_path go_directive staging="v0.${3#v1.}"
  mkdir -p "$dir"
  gomod_path=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  if [[ ! -f "$gomod_path" ]]; then
    echo "could not download k8s.io/kubernetes@$version" >&2
    return 1
  fi
  go_directive=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod_path" | head -n1)
  {
    echo "module $module"
    echo
    echo "go ${go_directive:-1.24}"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    echo "replace ("
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$gomod_path" \
      | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } >"$dir/go.mod"
}
