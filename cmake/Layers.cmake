# The layers, as the build sees them: a target compiles against the folders of the targets it
# links and no others. Each library exposes only its own folder, through a staging folder in the
# build tree that holds one link named for it (build/.../include/costmodel/costmodel -> costmodel/),
# so "documents/model.hpp" resolves in a target that links shardplan::costmodel and nowhere else:
# an include across an edge the CMake files do not declare is a build error.
#
# Which folder may use which is one table, cmake/layers.txt: scripts/include_graph.py --check holds
# every #include to it, and shardplan_check_layers below every library's and program's links.
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

# _shardplan_layer_folder(DIR OUT): the table's name for the folder of the targets defined in DIR:
# the top-level folder, a cuda/ subfolder on its own (kernels/cuda) and tests/ by its subfolders,
# as scripts/include_graph.py names the folder of a file. "" for the root, whose targets
# (shardplan::warnings, the precompiled headers' hosts) are settings, not a layer.
function(_shardplan_layer_folder dir out)
  file(RELATIVE_PATH relative ${PROJECT_SOURCE_DIR} ${dir})
  string(REPLACE "/" ";" parts "${relative}")
  list(LENGTH parts count)
  set(folder "")
  if(count GREATER 0)
    list(GET parts 0 folder)
  endif()
  if(count GREATER 1)
    list(GET parts 1 sub)
    if(folder STREQUAL "tests" OR sub STREQUAL "cuda")
      set(folder ${folder}/${sub})
    endif()
  endif()
  set(${out} "${folder}" PARENT_SCOPE)
endfunction()

# shardplan_check_layers(): called once every folder is added. Each library and program outside
# tests/ links (PUBLIC, PRIVATE or INTERFACE) only shardplan:: libraries of its own folder or of a
# folder that its row of cmake/layers.txt lists; otherwise configure fails, one line per link. A
# target's folder is the one whose CMakeLists.txt defines it (shardplan_executor_core: executor,
# shardplan_kernels_cuda: kernels/cuda, _shardplan: python). The tests' targets are not checked
# here: their folders' rules are include_graph.py's (allowed_from), over their includes.
function(shardplan_check_layers)
  set(table ${PROJECT_SOURCE_DIR}/cmake/layers.txt)
  file(RELATIVE_PATH table_name ${PROJECT_SOURCE_DIR} ${table})
  set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${table})
  file(STRINGS ${table} lines)
  set(folders "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "#.*" "" line "${line}")
    string(STRIP "${line}" line)
    if(line STREQUAL "")
      continue()
    endif()
    if(NOT line MATCHES "^([^: \t]+):(.*)$")
      message(FATAL_ERROR "${table_name}: not \"folder: folder folder ...\": ${line}")
    endif()
    set(folder ${CMAKE_MATCH_1})
    string(REGEX MATCHALL "[^ \t]+" uses "${CMAKE_MATCH_2}")
    if(folder IN_LIST folders)
      message(FATAL_ERROR "${table_name}: a second row for ${folder}")
    endif()
    list(APPEND folders ${folder})
    set(uses_${folder} ${uses})
  endforeach()

  set(wrong "")
  set(dirs ${PROJECT_SOURCE_DIR})
  while(dirs)
    list(POP_FRONT dirs dir)
    get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
    list(APPEND dirs ${subdirs})
    _shardplan_layer_folder(${dir} folder)
    if(folder STREQUAL "" OR folder MATCHES "^tests(/|$)")
      continue()
    endif()
    get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(target IN LISTS targets)
      get_target_property(type ${target} TYPE)
      if(NOT type MATCHES "_LIBRARY$|^EXECUTABLE$")
        continue()
      endif()
      if(NOT folder IN_LIST folders)
        message(FATAL_ERROR
          "layers: ${target} is defined in ${folder}/, which has no row in ${table_name}")
      endif()
      set(links "")
      foreach(property LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
        get_target_property(value ${target} ${property})
        if(value)
          list(APPEND links ${value})
        endif()
      endforeach()
      # The names inside generator expressions too: a static library's PRIVATE links reach its
      # INTERFACE_LINK_LIBRARIES as $<LINK_ONLY:shardplan::core>.
      string(REGEX MATCHALL "shardplan(::|_)[A-Za-z0-9_]+" names "${links}")
      list(REMOVE_DUPLICATES names)
      foreach(name IN LISTS names)
        if(NOT TARGET ${name})
          continue()
        endif()
        get_target_property(library ${name} ALIASED_TARGET)
        if(NOT library)
          set(library ${name})
        endif()
        get_target_property(library_dir ${library} SOURCE_DIR)
        _shardplan_layer_folder(${library_dir} used)
        if(used STREQUAL "" OR used STREQUAL folder OR used IN_LIST uses_${folder})
          continue()
        endif()
        # A program links its own folder's cuda/ library, which defines what the folder declares
        # for it (executor/cuda/: open_device, executor/device_run.hpp); its sources include
        # nothing of cuda/ (include_graph.py --check).
        if(type STREQUAL "EXECUTABLE" AND used STREQUAL "${folder}/cuda")
          continue()
        endif()
        list(APPEND wrong "layers: ${target} (${folder}/) links ${name} (${used}/), which \
${folder}/ may not use (${table_name})")
      endforeach()
    endforeach()
  endwhile()
  if(wrong)
    # Each line starts with a space: CMake prints such lines whole instead of wrapping them.
    list(JOIN wrong "\n " wrong)
    message(FATAL_ERROR " ${wrong}")
  endif()
endfunction()
