#!/usr/bin/env bash
# Debian 12's Open MPI for a machine that has none and no network (the lent GPU machine):
#
#   bash scripts/device-mpi.sh download DIR        # here: the runtime's .deb files into DIR
#   source scripts/device-mpi.sh env ROOT DIR      # there: unpack into ROOT, export the setting
#
# The binaries built here against libmpi.so.40 then run under ROOT's mpirun: Open MPI and PMIx
# relocated (OPAL_PREFIX, PMIX_INSTALL_PREFIX), shared-memory transport only (ob1, self and
# vader, single copy by the kernel's cross-memory attach as on this machine), no ssh.
packages=(openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7
          libevent-pthreads-2.1-7 libmunge2 libfabric1 libucx0 libibverbs1 ibverbs-providers
          librdmacm1 libnl-3-200 libnl-route-3-200 libpsm-infinipath1 libpsm2-2 libnuma1
          libatomic1 libudev1 libuuid1)

case ${1:-} in
  download)
    dir=$2
    mkdir -p "$dir"
    if ! ls "$dir"/libopenmpi3_*.deb >/dev/null 2>&1; then
      (cd "$dir" && apt-get download "${packages[@]}") ||
        { apt-get update -qq && (cd "$dir" && apt-get download "${packages[@]}"); }
    fi
    ;;
  env)
    root=$2 debs=$3
    mkdir -p "$root" && root=$(cd "$root" && pwd)
    if [[ ! -e $root/.unpacked ]]; then
      for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root" || return 1; done
      # What the packages' install scripts would make.
      ln -sf mpirun.openmpi "$root/usr/bin/mpirun"
      ln -sf ../libpsm1/libpsm_infinipath.so.1.16 "$root/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
      # Debian's libudev and libuuid only where the machine has none of its own.
      mkdir -p "$root/fallback"
      mv -f "$root"/{,usr/}lib/x86_64-linux-gnu/lib{udev,uuid}.so.1* "$root/fallback/" 2>/dev/null
      mkdir -p "$root/usr/lib/x86_64-linux-gnu/hwloc"  # no hwloc plugins from the machine
      sed -i "s#^mca_base_component_path *=.*#mca_base_component_path = $root/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix#" \
        "$root/usr/lib/x86_64-linux-gnu/pmix2/share/pmix-mca-params.conf"
      touch "$root/.unpacked"
    fi
    lib=$root/usr/lib/x86_64-linux-gnu
    ld=$lib/openmpi/lib:$lib/pmix2/lib:$lib:$root/lib/x86_64-linux-gnu
    ldconfig -p | grep -q 'libudev.so.1 ' && ldconfig -p | grep -q 'libuuid.so.1 ' || ld=$ld:$root/fallback
    export PATH=$root/usr/bin:$PATH LD_LIBRARY_PATH=$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export OPAL_PREFIX=$root/usr OPAL_EXEC_PREFIX=$root/usr OPAL_BINDIR=$root/usr/bin
    export OPAL_LIBDIR=$lib/openmpi/lib OPAL_PKGLIBDIR=$lib/openmpi/lib/openmpi3
    export OPAL_DATAROOTDIR=$root/usr/share OPAL_DATADIR=$root/usr/share
    export OPAL_PKGDATADIR=$root/usr/share/openmpi OPAL_SYSCONFDIR=$root/etc/openmpi
    export OMPI_MCA_mca_base_component_path=$lib/openmpi/lib/openmpi3
    export OMPI_MCA_mca_base_param_files=$root/etc/openmpi/openmpi-mca-params.conf
    export OMPI_MCA_orte_default_hostfile=$root/etc/openmpi/openmpi-default-hostfile
    export PMIX_INSTALL_PREFIX=$lib/pmix2 PMIX_PREFIX=$lib/pmix2
    export PMIX_MCA_mca_base_component_path=$lib/pmix2/lib/pmix
    export HWLOC_PLUGINS_PATH=$lib/hwloc HWLOC_COMPONENTS=-gl,-opencl,-cuda,-nvml,-rsmi,-levelzero
    export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_osc=^ucx,pt2pt
    export OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_plm=isolated OMPI_MCA_btl_base_warn_component_unused=0
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PMIX_MCA_pcompress_base_silence_warning=1
    mpirun -np 2 true
    ;;
  *)
    echo "usage: $0 download DIR | source $0 env ROOT DIR" >&2
    return 2 2>/dev/null || exit 2
    ;;
esac
