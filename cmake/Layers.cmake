# The layers, as the build sees them: a target compiles against the folders of the targets it
# links and no others. Each library exposes only its own folder, through a staging folder in the
# build tree that holds one link named for it (build/.../include/costmodel/costmodel -> costmodel/),
# so "documents/model.hpp" resolves in a target that links shardplan::costmodel and nowhere else:
# an include across an edge the CMake files do not declare is a build error.
#
#   core      <- everything (errors, JSON reading, number text, files)
#   costmodel <- core                     comm    <- core
#   kernels   <- comm, core               planner <- costmodel, core
#   executor  <- kernels, costmodel, comm, core
#   calibrate <- kernels, costmodel, comm, core
#
# shardplan_expose_folder(TARGET FOLDER): TARGET's users (and TARGET) see FOLDER's headers as
# "FOLDER/name.hpp".
function(shardplan_expose_folder target folder)
  set(stage ${PROJECT_BINARY_DIR}/include/${folder})
  file(MAKE_DIRECTORY ${stage})
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
