# The layers, as the build sees them: a target compiles against the folders of the targets it
# links and no others. Each library exposes only its own folder, through a staging folder in the
# build tree that holds one link named for it (build/.../include/costmodel/costmodel -> costmodel/),
# so "documents/model.hpp" resolves in a target that links shardplan::costmodel and nowhere else:
# an include across an edge the CMake files do not declare is a build error.
#
#   core      <- everything (errors, JSON reading, number text, files)
#   documents <- core (model, hardware, job, sharding spec and their JSON)
#   costmodel <- documents, core          comm    <- core
#   kernels   <- comm, core               planner <- costmodel, documents, core
#   executor  <- kernels, documents, comm, core
#   calibrate <- kernels, documents, costmodel, comm, core
#
# shardplan_expose_folder(TARGET FOLDER): TARGET's users (and TARGET) see FOLDER's headers as
# "FOLDER/name.hpp".
function(shardplan_expose_folder target folder)
  set(stage ${PROJECT_BINARY_DIR}/include/${folder})
  file(MAKE_DIRECTORY ${stage})
  # A build folder copied from another checkout keeps links into that checkout: made again here.
  if(IS_SYMLINK ${stage}/${folder})
    file(READ_SYMLINK ${stage}/${folder} linked)
    if(NOT linked STREQUAL "${PROJECT_SOURCE_DIR}/${folder}")
      file(REMOVE ${stage}/${folder})
    endif()
  endif()
  if(NOT EXISTS ${stage}/${folder})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${stage}/${folder} SYMBOLIC)
  endif()
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "INTERFACE_LIBRARY")
    target_include_directories(${target} INTERFACE ${stage})
  else()
    target_include_directories(${target} PUBLIC ${stage})
  endif()
endfunction()
