//! # UFS transport (UFSHCI 4.0): wire formats
//!
//! The UFS host-controller interface (UFSHCI 4.0, JESD223E) and the UFS
//! protocol units (UPIU) and SCSI command set it carries. Only the wire
//! formats live here so far — registers, transfer request descriptors,
//! completion entries, UPIUs, PRDT entries, CDBs, descriptors, status and
//! sense decoding — each in the file named after the spec's own noun:
//!
//! - [`spec::regs`]: host-controller registers, MCQ capability and per-queue
//!   configuration / operational registers, UIC commands.
//! - [`spec::utrd`]: UTP Transfer Request Descriptor (the SQ entry), MCQ
//!   completion entry, UTP command descriptor layout, PRDT entry, OCS.
//! - [`spec::upiu`]: UPIU header, COMMAND / RESPONSE, NOP OUT / IN,
//!   QUERY REQUEST / RESPONSE.
//! - [`spec::scsi`]: CDBs (READ/WRITE(10)/(16), SYNCHRONIZE CACHE(10), UNMAP,
//!   TEST UNIT READY, INQUIRY, READ CAPACITY(16), REQUEST SENSE, REPORT
//!   LUNS), SCSI status and fixed-format sense data.
//! - [`spec::desc`]: device, geometry and unit descriptors.
//! - [`spec::status`]: one typed error for a finished command, keeping the
//!   transport status (OCS) and the SCSI status apart.
//!
//! Byte order: UFSHCI structures in host memory (UTRD, CQE, PRDT) and
//! registers are little-endian; everything inside a UPIU, a CDB or a
//! descriptor is big-endian.

pub mod spec;
