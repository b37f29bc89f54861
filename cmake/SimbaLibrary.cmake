# simba_add_library: one library of Simba's, built static and (with
# SIMBA_BUILD_SHARED) shared from the same objects, and installed with both.
#
#   simba_add_library(NAME simba_backend_redis EXPORT_NAME backend_redis
#     SOURCES ...            the .cc files
#     SIMBA_DEPS ...         Simba libraries this one uses in its interface
#                            (by their static name: simba_core)
#     PUBLIC_LIBS ...        other targets its users need (Threads::Threads)
#     PRIVATE_LIBS ...       client libraries only its .cc files use
#     PRIVATE_INCLUDES ...   PRIVATE_SYSTEM_INCLUDES ...  PRIVATE_DEFINITIONS ...)
#
# Targets: NAME (static, what the tests link), simba::EXPORT_NAME (its alias),
# and NAME_shared (output name NAME, so libNAME.a and libNAME.so sit side by
# side). Each goes into its own export set, simba-static-targets or
# simba-shared-targets, under the same exported name simba::EXPORT_NAME:
# simbaConfig.cmake includes one of the two (see cmake/simbaConfig.cmake.in),
# so a user's target_link_libraries(app simba::simba) means the same library
# either way. The sources compile once (position-independent when shared
# libraries are built).

include(GNUInstallDirs)


function(simba_add_library)
  cmake_parse_arguments(L "" "NAME;EXPORT_NAME"
    "SOURCES;SIMBA_DEPS;PUBLIC_LIBS;PRIVATE_LIBS;PRIVATE_INCLUDES;PRIVATE_SYSTEM_INCLUDES;PRIVATE_DEFINITIONS"
    ${ARGN})
  set(objects ${L_NAME}_objects)
  add_library(${objects} OBJECT ${L_SOURCES})
  set_target_properties(${objects} PROPERTIES POSITION_INDEPENDENT_CODE ${SIMBA_BUILD_SHARED})
  target_include_directories(${objects} PRIVATE ${PROJECT_SOURCE_DIR}/include
    ${PROJECT_SOURCE_DIR}/src ${L_PRIVATE_INCLUDES})
  if(L_PRIVATE_SYSTEM_INCLUDES)
    target_include_directories(${objects} SYSTEM PRIVATE ${L_PRIVATE_SYSTEM_INCLUDES})
  endif()
  target_compile_definitions(${objects} PRIVATE ${L_PRIVATE_DEFINITIONS})
  # For the usage requirements (include paths, flags) of what it uses only.
  target_link_libraries(${objects} PRIVATE ${L_SIMBA_DEPS} ${L_PUBLIC_LIBS} ${L_PRIVATE_LIBS})
  simba_target_settings(${objects})

  set(kinds static)
  if(SIMBA_BUILD_SHARED)
    list(APPEND kinds shared)
  endif()
  foreach(kind IN LISTS kinds)
    if(kind STREQUAL "static")
      set(target ${L_NAME})
      set(deps ${L_SIMBA_DEPS})
      add_library(${target} STATIC $<TARGET_OBJECTS:${objects}>)
      add_library(simba::${L_EXPORT_NAME} ALIAS ${target})
      install(TARGETS ${target} EXPORT simba-static-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
    else()
      set(target ${L_NAME}_shared)
      list(TRANSFORM L_SIMBA_DEPS APPEND _shared OUTPUT_VARIABLE deps)
      add_library(${target} SHARED $<TARGET_OBJECTS:${objects}>)
      set_target_properties(${target} PROPERTIES
        OUTPUT_NAME ${L_NAME}
        VERSION ${PROJECT_VERSION}
        SOVERSION ${SIMBA_SOVERSION}
        # Its sibling libraries are found next to it wherever the prefix is.
        INSTALL_RPATH "$ORIGIN")
      install(TARGETS ${target} EXPORT simba-shared-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT libs NAMELINK_COMPONENT dev)
    endif()
    set_target_properties(${target} PROPERTIES EXPORT_NAME ${L_EXPORT_NAME})
    target_include_directories(${target} PUBLIC
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_compile_features(${target} PUBLIC cxx_std_20)
    target_link_libraries(${target} PUBLIC ${deps} ${L_PUBLIC_LIBS} PRIVATE ${L_PRIVATE_LIBS})
    if(_simba_sanitize_flags)
      target_link_options(${target} PUBLIC ${_simba_sanitize_flags})
    endif()
  endforeach()
endfunction()
